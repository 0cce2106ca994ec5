"""Reading a generated selection_table.hpp (make_table.py's output): its point rows and its
provenance. make_table.py reads its --base header through these, and the table tools' tests
(make_table_test.py, scripts/attention_table_test.py) read the headers they produce. row_kind is
the tests' own reading of a row's kind, kept apart from make_table.py's kind_of, which they check."""
import re


def point_rows(text):
    """The header's point rows in order, each without its indentation: "{DType::bf16, ...},"."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith("{DType::")]


def provenance(text):
    """kSelectionProvenance: the string literal's pieces joined."""
    return "".join(re.findall(r'"([^"]*)"', re.search(
        r'kSelectionProvenance =\s*((?:"[^"]*"\s*)+);', text).group(1)))


def row_kind(row):
    """A point row's (dtype, chunk point?, short Lq = Lk point?): the kinds a run replaces one at a
    time. Chunk rows carry a ninth field (Lq); short Lq = Lk rows have L < 512."""
    fields = row.strip("{},").split(", ")
    return (fields[0].split("::")[1], len(fields) == 9, len(fields) == 8 and int(fields[3]) < 512)
