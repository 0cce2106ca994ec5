// write_slice / kv_append: descriptor rules, argument rules, and the copy-path analysis that lets
// select() pick a fast path for the layout. All validation lives here, with precise messages.
#include <algorithm>
#include <string>
#include <vector>

#include "baracuda/core/validate.hpp"
#include "baracuda/ops/write_slice.hpp"

namespace baracuda {
namespace write_slice_detail {

std::string_view to_string(Path p) {
  switch (p) {
    case Path::empty:
      return "empty";
    case Path::whole_copy:
      return "whole_copy";
    case Path::contiguous_chunk:
      return "contiguous_chunk";
    case Path::pitched_2d:
      return "pitched_2d";
    case Path::generic:
      return "generic";
    case Path::subbyte_merge:
      return "subbyte_merge";
  }
  return "?";
}

namespace {

using std::to_string;

struct Axis {
  int64_t extent, dst, src;  // strides in bytes
};

std::string err_prefix(std::string_view arg) {
  return std::string(WriteSliceOp::name) + ": " + std::string(arg);
}

// Strides of one descriptor tensor: explicit, or dense row-major when empty. Checks sign, the
// sub-byte packing rule, and (for the destination) that no two elements share storage, since
// a self-overlapping destination would make the write set ambiguous and the kernels racy.
Status check_strides(std::string_view arg, DType dtype, int rank, const Shape& shape,
                     const std::vector<int64_t>& given, bool is_dest, Shape* out) {
  if (given.empty()) {
    // Dense strides still go through every check below: the span in bits (a dense view's element
    // count fits in int64, its bits need not), and for sub-byte types the packing rule.
    *out = contiguous_strides(std::span<const int64_t>(shape.data(), rank));
  } else {
    if (static_cast<int>(given.size()) != rank)
      return Error::invalid(err_prefix(arg) + ": " + to_string(given.size()) +
                            " entries for rank " + to_string(rank));
    for (int d = 0; d < rank; ++d) (*out)[d] = given[d];
  }
  for (int d = 0; d < rank; ++d) {
    const int64_t s = (*out)[d];
    const std::string at = err_prefix(arg) + "[" + to_string(d) + "]=" + to_string(s);
    if (s < 0) return Error::invalid(at + " is negative");
    if (is_dest && s == 0 && shape[d] > 1)
      return Error::invalid(at + " broadcasts (shape " + to_string(shape[d]) +
                            "), which is only legal for the source");
  }
  if (is_sub_byte(dtype)) {
    const int epb = elements_per_byte(dtype);
    if (shape[rank - 1] > 1 && (*out)[rank - 1] != 1)
      return Error::invalid(err_prefix(arg) + "[" + to_string(rank - 1) +
                            "]=" + to_string((*out)[rank - 1]) + ": " + std::string(name(dtype)) +
                            " packs along the innermost axis, whose stride must be 1");
    for (int d = 0; d + 1 < rank; ++d)
      if (shape[d] > 1 && (*out)[d] % epb != 0)
        return Error::invalid(err_prefix(arg) + "[" + to_string(d) + "]=" + to_string((*out)[d]) +
                              ": " + std::string(name(dtype)) +
                              " rows must start on a byte (a multiple of " + to_string(epb) + ")");
  }
  // The view's span must fit in int64 bytes (an empty view spans nothing).
  int64_t last = 0;
  bool empty = false;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 0) {
      last = 0, empty = true;
      break;
    }
    int64_t step = 0, elements = 0, bits = 0;
    if (!checked_mul(shape[d] - 1, (*out)[d], &step) || !checked_add(last, step, &last) ||
        !checked_add(last, 1, &elements) || !checked_mul(elements, bits_of(dtype), &bits))
      return Error::invalid(err_prefix(arg) + ": the view spans more than 2^63 bits");
  }
  // An empty destination writes nothing, so it cannot overlap itself (and its strides were not
  // bounded by a span, so the reach below could overflow).
  if (!is_dest || empty) return {};
  // Non-self-overlap: sorted by stride, each axis must step past everything the inner ones reach.
  std::vector<int> axes;
  for (int d = 0; d < rank; ++d)
    if (shape[d] > 1) axes.push_back(d);
  std::stable_sort(axes.begin(), axes.end(), [&](int a, int b) { return (*out)[a] < (*out)[b]; });
  int64_t reach = 1;  // elements spanned by the axes seen so far
  int prev = -1;
  for (int d : axes) {
    if ((*out)[d] < reach)
      return Error::invalid(err_prefix(arg) + "[" + to_string(d) + "]=" + to_string((*out)[d]) +
                            " steps inside axis " + to_string(prev) + " (which spans " +
                            to_string(reach) + " elements): the destination overlaps itself");
    reach = (*out)[d] * (shape[d] - 1) + reach;  // fits: the span check above bounds it
    prev = d;
  }
  return {};
}

// Sort outer axes by destination stride (outermost first) and merge nested neighbours, so
// permuted and padded layouts collapse to as few axes as the memory allows.
void coalesce(std::vector<Axis>& axes, int64_t* inner_bytes, bool merge_into_run) {
  std::stable_sort(axes.begin(), axes.end(),
                   [](const Axis& a, const Axis& b) { return a.dst > b.dst; });
  if (merge_into_run)
    while (!axes.empty() && axes.back().dst == *inner_bytes && axes.back().src == *inner_bytes) {
      *inner_bytes *= axes.back().extent;
      axes.pop_back();
    }
  std::vector<Axis> merged;
  for (const Axis& a : axes) {
    if (!merged.empty()) {
      Axis& o = merged.back();
      // o (outer) and a (inner) nest when o steps over exactly a's extent on both sides.
      if (o.dst == a.extent * a.dst && o.src == a.extent * a.src) {
        o = {o.extent * a.extent, a.dst, a.src};
        continue;
      }
    }
    merged.push_back(a);
  }
  axes = std::move(merged);
}

}  // namespace

// Reduces the window write to the fewest axes and classifies it. Strides are validated and the
// window's span fits in int64 (checked in check_strides), so the products below cannot overflow.
void analyse(WriteSliceOp::Problem& p) {
  CopyShape& c = p.copy;
  const int r = p.rank;
  const int bits = bits_of(p.dtype);
  int64_t numel = 1;
  for (int d = 0; d < r; ++d) numel *= p.source_shape[d];
  if (numel == 0) {
    p.path = Path::empty;
    return;
  }
  // Offsets in bits keep byte and sub-byte types on one formula.
  int64_t origin_bits = 0;
  for (int d = 0; d < r; ++d) origin_bits += p.start[d] * p.dest_stride[d] * bits;
  std::vector<Axis> axes;
  int64_t run_bits = 0;
  int64_t inner_start_bits = 0;
  if (bits >= 8) {
    for (int d = 0; d < r; ++d)
      if (p.source_shape[d] > 1)
        axes.push_back(
            {p.source_shape[d], p.dest_stride[d] * bits / 8, p.source_stride[d] * bits / 8});
    run_bits = bits;  // one element; coalescing grows it
  } else {
    // Sub-byte: the innermost axis is the packed row; outer strides are whole bytes.
    for (int d = 0; d + 1 < r; ++d)
      if (p.source_shape[d] > 1)
        axes.push_back(
            {p.source_shape[d], p.dest_stride[d] * bits / 8, p.source_stride[d] * bits / 8});
    run_bits = p.source_shape[r - 1] * bits;
    inner_start_bits = p.start[r - 1] * bits;
    origin_bits -= inner_start_bits;  // row base: byte aligned
  }
  const bool byte_aligned = (origin_bits + inner_start_bits) % 8 == 0 && run_bits % 8 == 0;
  c.dst_offset = (origin_bits + (byte_aligned ? inner_start_bits : 0)) / 8;
  int64_t inner = byte_aligned ? run_bits / 8 : 0;
  coalesce(axes, &inner, byte_aligned);
  c.outer_rank = static_cast<int>(axes.size());
  c.rows = 1;
  for (int i = 0; i < c.outer_rank; ++i) {
    c.extent[i] = axes[i].extent;
    c.dst_stride[i] = axes[i].dst;
    c.src_stride[i] = axes[i].src;
    c.rows *= axes[i].extent;
  }
  if (!byte_aligned) {
    c.row_bit_offset = inner_start_bits;
    c.row_bits = run_bits;
    p.path = Path::subbyte_merge;
    return;
  }
  c.inner_bytes = inner;
  if (c.outer_rank == 0) {
    bool whole = true;
    int64_t dest_bits = bits;
    for (int d = 0; d < r; ++d) {
      whole &= p.source_shape[d] == p.dest_shape[d];
      dest_bits *= p.dest_shape[d];
    }
    p.path = whole && dest_bits == inner * 8 ? Path::whole_copy : Path::contiguous_chunk;
  } else {
    p.path = c.outer_rank == 1 ? Path::pitched_2d : Path::generic;
  }
}

}  // namespace write_slice_detail

using std::to_string;

Result<WriteSliceOp::Problem> WriteSliceOp::make_problem(const Descriptor& d) {
  const std::string op(name);
  if (static_cast<int>(d.dtype) >= kDTypeCount)
    return Error::invalid(op + ": dtype " + to_string(static_cast<int>(d.dtype)) +
                          " is not in the element bank");
  BARACUDA_TRY(validate::shape(name, "dest_shape", d.dest_shape));
  const int rank = static_cast<int>(d.dest_shape.size());
  if (static_cast<int>(d.ranges.size()) != rank)
    return Error::invalid(op + ": ranges: " + to_string(d.ranges.size()) + " entries for rank " +
                          to_string(rank));
  if (static_cast<int>(d.source_shape.size()) != rank)
    return Error::invalid(op + ": source_shape: rank " + to_string(d.source_shape.size()) +
                          ", expected " + to_string(rank) + " (the rank of dest_shape)");
  Problem p;
  p.dtype = d.dtype;
  p.rank = rank;
  for (int i = 0; i < rank; ++i) {
    const auto [s, e] = d.ranges[i];
    const std::string at =
        op + ": ranges[" + to_string(i) + "]=(" + to_string(s) + "," + to_string(e) + "): ";
    if (s < 0) return Error::invalid(at + "start < 0");
    if (s > e) return Error::invalid(at + "start > end");
    if (e > d.dest_shape[i])
      return Error::invalid(at + "end > dest_shape[" + to_string(i) +
                            "]=" + to_string(d.dest_shape[i]));
    if (d.source_shape[i] != e - s)
      return Error::invalid(
          op + ": source_shape[" + to_string(i) + "]=" + to_string(d.source_shape[i]) +
          ", expected end - start = " + to_string(e - s) + " for ranges[" + to_string(i) + "]");
    p.dest_shape[i] = d.dest_shape[i];
    p.source_shape[i] = d.source_shape[i];
    p.start[i] = s;
  }
  BARACUDA_TRY(write_slice_detail::check_strides("dest_stride", d.dtype, rank, p.dest_shape,
                                                 d.dest_stride, true, &p.dest_stride));
  BARACUDA_TRY(write_slice_detail::check_strides("source_stride", d.dtype, rank, p.source_shape,
                                                 d.source_stride, false, &p.source_stride));
  write_slice_detail::analyse(p);
  return p;
}

namespace {
// The plan's copy path was derived from the descriptor's strides, so the tensors must have them.
template <class Ptr>
Status same_strides(std::string_view arg, const BasicTensor<Ptr>& t, const Shape& planned) {
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1 && t.stride[d] != planned[d])
      return Error::invalid(std::string(WriteSliceOp::name) + ": " + std::string(arg) +
                            ": stride[" + to_string(d) + "]=" + to_string(t.stride[d]) +
                            " but the plan was built for " + to_string(planned[d]));
  return {};
}
}  // namespace

Status WriteSliceOp::check_arguments(const Problem& p, const Arguments& a, Location where) {
  const std::span<const int64_t> dest_dims(p.dest_shape.data(), p.rank);
  const std::span<const int64_t> src_dims(p.source_shape.data(), p.rank);
  BARACUDA_TRY(validate::tensor(name, "dest", a.dest, p.dtype, dest_dims, where));
  BARACUDA_TRY(same_strides("dest", a.dest, p.dest_stride));
  BARACUDA_TRY(validate::tensor(name, "source", a.source, p.dtype, src_dims, where,
                                {.allow_broadcast = true}));
  BARACUDA_TRY(same_strides("source", a.source, p.source_stride));
  // Whole spans, not just the window: conservative, and exact for dense tensors.
  return validate::no_overlap(name, "dest", a.dest, "source", a.source);
}

// ---- kv_append
// -----------------------------------------------------------------------------------
Result<KvAppendOp::Problem> KvAppendOp::make_problem(const Descriptor& d) {
  const std::string op(name);
  if (static_cast<int>(d.dtype) >= kDTypeCount)
    return Error::invalid(op + ": dtype " + to_string(static_cast<int>(d.dtype)) +
                          " is not in the element bank");
  const int64_t dims[] = {d.batch, d.heads, d.max_len, d.head_dim};
  BARACUDA_TRY(validate::shape(name, "cache", dims));
  if (d.tokens < 0) return Error::invalid(op + ": tokens=" + to_string(d.tokens) + " is negative");
  if (d.tokens > d.max_len)
    return Error::invalid(op + ": tokens=" + to_string(d.tokens) +
                          " exceeds max_len=" + to_string(d.max_len));
  if (d.position_dtype != DType::i32 && d.position_dtype != DType::i64)
    return Error::invalid(op + ": position_dtype " + std::string(baracuda::name(d.position_dtype)) +
                          ", expected i32 or i64");
  if (is_sub_byte(d.dtype) && d.head_dim % elements_per_byte(d.dtype) != 0)
    return Error::unsupported(op + ": head_dim=" + to_string(d.head_dim) +
                              " is not a multiple of " + to_string(elements_per_byte(d.dtype)) +
                              ": " + std::string(baracuda::name(d.dtype)) +
                              " rows must be whole bytes for kv_append (use write_slice)");
  return d;
}

Status KvAppendOp::check_arguments(const Problem& p, const Arguments& a, Location where) {
  const int64_t cache_dims[] = {p.batch, p.heads, p.max_len, p.head_dim};
  const int64_t src_dims[] = {p.batch, p.heads, p.tokens, p.head_dim};
  const int64_t b_dims[] = {p.batch};
  BARACUDA_TRY(validate::tensor(name, "cache", a.cache, p.dtype, cache_dims, where));
  BARACUDA_TRY(validate::tensor(name, "source", a.source, p.dtype, src_dims, where,
                                {.allow_broadcast = true}));
  BARACUDA_TRY(validate::tensor(name, "positions", a.positions, p.position_dtype, b_dims, where,
                                {.allow_broadcast = true}));
  BARACUDA_TRY(validate::tensor(name, "rejected", a.rejected, DType::i32, b_dims, where));
  BARACUDA_TRY(validate::no_overlap(name, "cache", a.cache, "source", a.source));
  BARACUDA_TRY(validate::no_overlap(name, "cache", a.cache, "positions", a.positions));
  BARACUDA_TRY(validate::no_overlap(name, "rejected", a.rejected, "positions", a.positions));
  return validate::no_overlap(name, "rejected", a.rejected, "cache", as_const(a.cache));
}

}  // namespace baracuda
