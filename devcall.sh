set -u
export BARACUDA_COMMIT=wip-$(date +%H%M)
STAGES="test bench" TEST_TIMEOUT=200 BENCH_TIMEOUT=120 TEST_FILTER_ssd='*BackwardWalksOnDevice*' \
  BARACUDA_SSD_ONLY=backward BARACUDA_SSD_STAGES=1 bash scripts/gpu-family.sh ssd > $OUT/family.log 2>&1
cat $OUT/summary.txt
grep -B3 -A15 "Failure" $OUT/family.log | head -60
python3 - <<'PY'
import json,os
for l in open(os.environ['OUT']+'/bench.jsonl'):
    r=json.loads(l)
    if r.get('op','').startswith('ssd_backward') and '@' not in r['name']: print(r['name'][:12], r.get('note'), r['ms'])
PY
