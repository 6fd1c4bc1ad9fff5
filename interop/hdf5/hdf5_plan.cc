#include "ckpt/interop/hdf5/hdf5_plan.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/hdf5/hdf5_names.h"

namespace ckpt::interop {
namespace {

using hdf5::Handle;
using hdf5::Hdf5Error;
using hdf5::Hdf5Lock;

// HDF5 1.12 replaced object addresses by tokens and versioned the
// iteration functions; the adapter needs only a stable identity per object.
//
// Links and attributes are iterated in native order and sorted here: in
// name order HDF5 first builds a sorted table of a dense group's links,
// and 1.10.8 frees garbage from that table when a hostile file makes the
// build fail (found by hdf5_plan_fuzz.cc).
#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info2_t;
using LinkInfo = H5L_info2_t;
std::string ObjectKey(const ObjectInfo& i) {
  return std::string(reinterpret_cast<const char*>(&i.token), sizeof(i.token));
}
herr_t GetObjectInfoByName(hid_t loc, const char* name, ObjectInfo* info) {
  return H5Oget_info_by_name3(loc, name, info, H5O_INFO_BASIC, H5P_DEFAULT);
}
herr_t IterateLinks(hid_t g,
                    herr_t (*op)(hid_t, const char*, const LinkInfo*, void*),
                    void* data) {
  hsize_t idx = 0;
  return H5Literate2(g, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, op, data);
}
#else
using ObjectInfo = H5O_info_t;
using LinkInfo = H5L_info_t;
std::string ObjectKey(const ObjectInfo& i) {
  return absl::StrCat(i.fileno, ":", i.addr);
}
herr_t GetObjectInfoByName(hid_t loc, const char* name, ObjectInfo* info) {
  return H5Oget_info_by_name2(loc, name, info, H5O_INFO_BASIC, H5P_DEFAULT);
}
herr_t IterateLinks(hid_t g,
                    herr_t (*op)(hid_t, const char*, const LinkInfo*, void*),
                    void* data) {
  hsize_t idx = 0;
  return H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, op, data);
}
#endif

// A path or attribute name as shown in messages: at most 200 bytes,
// through format::EscapeText.
std::string Shown(absl::string_view s) {
  std::string out = format::EscapeText(s.substr(0, 200));
  if (s.size() > 200) out += "...";
  return out;
}

std::string DatasetWhere(absl::string_view path) {
  return absl::StrCat("dataset '", Shown(path), "'");
}

// Errors that --skip-unsupported turns into skips: the input is readable
// but cannot be expressed as a checkpoint.
bool Skippable(const absl::Status& s) { return absl::IsInvalidArgument(s); }

// The links of one group, collected in one pass (by-index access would be
// quadratic in old-style groups, which h5py writes by default).
struct GroupLinks {
  struct Link {
    std::string name;  // at most kMaxPath + 1 bytes (longer names are cut)
    bool hard = false;
  };
  std::vector<Link> links;
  uint64_t* total = nullptr;  // links seen in the whole file
  bool too_many = false;
};

constexpr size_t kMaxPath = format::kMaxNameLength + 64;

herr_t CollectLink(hid_t, const char* name, const LinkInfo* info, void* data) {
  auto* g = static_cast<GroupLinks*>(data);
  if (++*g->total > kMaxVisitedObjects) {
    g->too_many = true;
    return 1;  // stops the iteration
  }
  g->links.push_back({std::string(name, strnlen(name, kMaxPath + 1)),
                      info->type == H5L_TYPE_HARD});
  return 0;
}

// The walk of ListDatasets: the groups still to visit, the objects seen
// and what was found.
class DatasetWalk {
 public:
  DatasetWalk(hid_t file, std::vector<std::string>* datasets,
              std::vector<ImportSkipped>* skipped, bool skip_unsupported)
      : file_(file),
        datasets_(datasets),
        skipped_(skipped),
        skip_unsupported_(skip_unsupported) {}

  absl::Status Run() {
    ObjectInfo info;
    if (GetObjectInfoByName(file_, "/", &info) < 0) {
      return Hdf5Error(absl::StatusCode::kDataLoss, "the root group");
    }
    seen_.insert(ObjectKey(info));
    std::vector<std::string> stack = {""};  // group paths; "" is the root
    while (!stack.empty()) {
      const std::string group_path = std::move(stack.back());
      stack.pop_back();
      CKPT_RETURN_IF_ERROR(VisitGroup(group_path, stack));
    }
    std::sort(datasets_->begin(), datasets_->end());
    return absl::OkStatus();
  }

 private:
  // An unsupported link or group: the error, or (skip_unsupported) a skip.
  absl::Status Problem(const std::string& what, std::string message) {
    absl::Status s = absl::InvalidArgumentError(std::move(message));
    if (!skip_unsupported_) return s;
    skipped_->push_back({what, std::string(s.message())});
    return absl::OkStatus();
  }

  // The links of group `group_path`: datasets found, groups pushed on
  // `stack`.
  absl::Status VisitGroup(const std::string& group_path,
                          std::vector<std::string>& stack) {
    const std::string shown = group_path.empty() ? "/" : group_path;
    const std::string where = absl::StrCat("group '", Shown(shown), "'");
    Handle g(H5Gopen2(file_, shown.c_str(), H5P_DEFAULT));
    if (!g.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
    GroupLinks links;
    links.total = &total_;
    if (IterateLinks(g.get(), CollectLink, &links) < 0) {
      return Hdf5Error(absl::StatusCode::kDataLoss,
                       absl::StrCat(where, ": its links"));
    }
    if (links.too_many) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", kMaxVisitedObjects, " links in the file"));
    }
    if (!links.links.empty() && group_path.size() > kMaxPath) {
      return Problem(shown, absl::StrCat(where, ": nested too deep (a path of ",
                                         group_path.size(),
                                         " bytes; entry names have at most ",
                                         format::kMaxNameLength, ")"));
    }
    for (const GroupLinks::Link& link : links.links) {
      if (!link.hard) continue;  // not followed
      CKPT_RETURN_IF_ERROR(VisitLink(g.get(), group_path, where, link, stack));
    }
    return absl::OkStatus();
  }

  // The hard link `link` of group `g`: its target, once.
  absl::Status VisitLink(hid_t g, const std::string& group_path,
                         const std::string& where, const GroupLinks::Link& link,
                         std::vector<std::string>& stack) {
    const std::string path = absl::StrCat(group_path, "/", link.name);
    if (link.name.size() > kMaxPath) {
      return Problem(path, absl::StrCat(where, ": a link name of more than ",
                                        kMaxPath, " bytes"));
    }
    if (link.name.empty() || link.name == "." ||
        link.name.find('/') != std::string::npos) {
      return Problem(path,
                     absl::StrCat(where, ": link name '", Shown(link.name),
                                  "' is not a path part"));
    }
    ObjectInfo oinfo;
    if (GetObjectInfoByName(g, link.name.c_str(), &oinfo) < 0) {
      return Hdf5Error(absl::StatusCode::kDataLoss,
                       absl::StrCat("object '", Shown(path), "'"));
    }
    if (!seen_.insert(ObjectKey(oinfo)).second) {
      return absl::OkStatus();  // another hard link to it
    }
    if (oinfo.type == H5O_TYPE_GROUP) {
      stack.push_back(path);
    } else if (oinfo.type == H5O_TYPE_DATASET) {
      datasets_->push_back(path);
    }
    // Named datatypes hold no data.
    return absl::OkStatus();
  }

  const hid_t file_;
  std::vector<std::string>* const datasets_;
  std::vector<ImportSkipped>* const skipped_;
  const bool skip_unsupported_;
  absl::flat_hash_set<std::string> seen_;
  uint64_t total_ = 0;  // links seen in the whole file
};

// The paths of all datasets reachable through hard links from the root,
// each dataset once (another hard link to a dataset already seen is
// ignored), sorted. Soft, external and user-defined links are not
// followed. Bounded: kMaxVisitedObjects links, paths of kMaxPath bytes.
absl::Status ListDatasets(hid_t file, std::vector<std::string>* datasets,
                          std::vector<ImportSkipped>* skipped,
                          bool skip_unsupported) {
  return DatasetWalk(file, datasets, skipped, skip_unsupported).Run();
}

absl::StatusOr<std::optional<std::string>> SmallStringAttr(
    hid_t obj, absl::string_view name, absl::string_view where) {
  return hdf5::ReadBytesAttribute(obj, name, 256, where);
}

absl::Status CheckStorage(hid_t ds, uint64_t type_size,
                          absl::string_view where) {
  Handle dcpl(H5Dget_create_plist(ds));
  if (!dcpl.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS &&
      layout != H5D_CHUNKED) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": unsupported storage layout (",
        layout == H5D_VIRTUAL ? "virtual dataset" : "unknown", ")"));
  }
  int external = H5Pget_external_count(dcpl.get());
  if (external != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": its raw data is in external files, which are never read"));
  }
  if (layout == H5D_CHUNKED) {
    hsize_t chunk[H5S_MAX_RANK];
    int rank = H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, chunk);
    if (rank < 0) return Hdf5Error(absl::StatusCode::kDataLoss, where);
    uint64_t bytes = type_size;
    for (int d = 0; d < rank && d < H5S_MAX_RANK; ++d) {
      if (chunk[d] != 0 && bytes > kMaxImportChunkBytes / chunk[d]) {
        bytes = kMaxImportChunkBytes + 1;
        break;
      }
      bytes *= chunk[d];
    }
    if (bytes > kMaxImportChunkBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": HDF5 chunks of more than ",
                       kMaxImportChunkBytes, " bytes are not read"));
    }
  }
  int nfilters = H5Pget_nfilters(dcpl.get());
  if (nfilters < 0) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  for (int i = 0; i < nfilters; ++i) {
    unsigned flags = 0, config = 0;
    size_t nelmts = 0;
    char fname[64] = {0};
    H5Z_filter_t id = H5Pget_filter2(dcpl.get(), i, &flags, &nelmts, nullptr,
                                     sizeof(fname), fname, &config);
    if (id < 0) return Hdf5Error(absl::StatusCode::kDataLoss, where);
    if (H5Zfilter_avail(id) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      fname[sizeof(fname) - 1] = '\0';
      return absl::InvalidArgumentError(absl::StrCat(where, ": HDF5 filter ",
                                                     id, " ('", Shown(fname),
                                                     "') is not available"));
    }
  }
  return absl::OkStatus();
}

// The shape of dataset `ds` from its dataspace, into *shape ([] for a
// scalar). InvalidArgument for a null dataspace, DataLoss when HDF5 cannot
// read it.
absl::Status DatasetShape(hid_t ds, const std::string& where, Shape* shape) {
  Handle space(H5Dget_space(ds));
  if (!space.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  switch (H5Sget_simple_extent_type(space.get())) {
    case H5S_SCALAR:
      return absl::OkStatus();
    case H5S_SIMPLE: {
      int nd = H5Sget_simple_extent_ndims(space.get());
      if (nd < 0 || nd > H5S_MAX_RANK)
        return Hdf5Error(absl::StatusCode::kDataLoss, where);
      hsize_t dims[H5S_MAX_RANK];
      if (H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0) {
        return Hdf5Error(absl::StatusCode::kDataLoss, where);
      }
      shape->assign(dims, dims + nd);
      return absl::OkStatus();
    }
    case H5S_NULL:
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": null dataspace (no shape, as h5py.Empty writes)"));
    default:
      return Hdf5Error(absl::StatusCode::kDataLoss, where);
  }
}

// Makes `e` (of type `it`, HDF5 type `type`) an object when its
// ckpt_kind attribute says so or its type is opaque: uint8 of shape
// {bytes}. InvalidArgument for a kind attribute of another value, an opaque
// dataset that would be a tensor or is not 1-d, an "object" that is not a
// 1-d uint8 array, or an object over kMaxImportObjectBytes.
absl::Status ApplyKind(const std::optional<std::string>& kind_attr,
                       const hdf5::ImportType& it, hid_t type,
                       const std::string& where, ImportPlanEntry& e) {
  const bool object_attr =
      kind_attr.has_value() && *kind_attr == hdf5::kKindObject;
  if (kind_attr.has_value() && !object_attr &&
      *kind_attr != hdf5::kKindTensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": attribute ", hdf5::kKindAttr, " is '", Shown(*kind_attr),
        "', not '", hdf5::kKindObject, "' or '", hdf5::kKindTensor, "'"));
  }
  if (it.opaque) {
    if (kind_attr.has_value() && !object_attr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": an opaque dataset can only be an object"));
    }
    if (e.shape.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": an opaque dataset must be a scalar or 1-d, not ",
          ShapeToString(e.shape)));
    }
  } else if (object_attr &&
             (e.dtype != DType::kUInt8 || e.mem != hdf5::MemKind::kU8 ||
              e.shape.size() != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": attribute ", hdf5::kKindAttr,
        " is 'object' but the dataset is ", hdf5::TypeDescription(type), " ",
        ShapeToString(e.shape), ", not a 1-d array of uint8"));
  }
  if (!it.opaque && !object_attr) return absl::OkStatus();
  if (e.bytes > kMaxImportObjectBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": an object of ", e.bytes, " bytes; the limit is ",
                     kMaxImportObjectBytes));
  }
  e.kind = format::EntryKind::kObject;
  e.dtype = DType::kUInt8;
  e.shape = {e.bytes};
  return absl::OkStatus();
}

absl::StatusOr<ImportPlanEntry> PlanDataset(hid_t file,
                                            const std::string& path) {
  const std::string where = DatasetWhere(path);
  ImportPlanEntry e;
  e.path = path;
  CKPT_ASSIGN_OR_RETURN(e.name, hdf5::EntryNameOfPath(path));
  Handle ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT));
  if (!ds.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  CKPT_ASSIGN_OR_RETURN(std::optional<std::string> dtype_attr,
                        SmallStringAttr(ds.get(), hdf5::kDTypeAttr, where));
  CKPT_ASSIGN_OR_RETURN(std::optional<std::string> kind_attr,
                        SmallStringAttr(ds.get(), hdf5::kKindAttr, where));
  Handle type(H5Dget_type(ds.get()));
  if (!type.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  CKPT_ASSIGN_OR_RETURN(hdf5::ImportType it,
                        hdf5::ClassifyType(type.get(), dtype_attr, where));
  e.dtype = it.dtype;
  e.mem = it.mem;
  CKPT_RETURN_IF_ERROR(DatasetShape(ds.get(), where, &e.shape));
  CKPT_RETURN_IF_ERROR(Annotate(
      ValidateShape(e.shape, static_cast<int>(it.element_size)), where));
  CKPT_RETURN_IF_ERROR(CheckStorage(ds.get(), it.element_size, where));
  uint64_t numel = 1;
  for (uint64_t d : e.shape) numel *= d;  // ValidateShape: fits in int64
  e.bytes = numel * it.element_size;
  CKPT_RETURN_IF_ERROR(ApplyKind(kind_attr, it, type.get(), where, e));
  return e;
}

// A root attribute as a metadata value: strings and byte arrays as they
// are, scalar numbers and booleans as text.
absl::StatusOr<std::string> ReadMetadataValue(hid_t attr,
                                              absl::string_view what) {
  Handle type(H5Aget_type(attr));
  Handle space(H5Aget_space(attr));
  if (!type.valid() || !space.valid())
    return Hdf5Error(absl::StatusCode::kDataLoss, what);
  const bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (scalar && cls == H5T_INTEGER && size <= 8) {
    if (H5Tget_sign(type.get()) == H5T_SGN_2) {
      int64_t v = 0;
      if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0) {
        return Hdf5Error(absl::StatusCode::kDataLoss, what);
      }
      return absl::StrCat(v);
    }
    uint64_t v = 0;
    if (H5Aread(attr, H5T_NATIVE_UINT64, &v) < 0) {
      return Hdf5Error(absl::StatusCode::kDataLoss, what);
    }
    return absl::StrCat(v);
  }
  if (scalar && cls == H5T_FLOAT && (size == 2 || size == 4 || size == 8)) {
    double v = 0;
    if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v) < 0) {
      return Hdf5Error(absl::StatusCode::kDataLoss, what);
    }
    return size == 8 ? absl::StrFormat("%.17g", v) : absl::StrFormat("%.9g", v);
  }
  if (scalar && cls == H5T_ENUM) {
    CKPT_ASSIGN_OR_RETURN(hdf5::ImportType it,
                          hdf5::ClassifyType(type.get(), std::nullopt, what));
    (void)it;  // a bool enum
    CKPT_ASSIGN_OR_RETURN(Handle mem, hdf5::MakeBoolType());
    int8_t v = 0;
    if (H5Aread(attr, mem.get(), &v) < 0)
      return Hdf5Error(absl::StatusCode::kDataLoss, what);
    return std::string(v ? "true" : "false");
  }
  return hdf5::ReadBytesAttributeById(attr, format::kMaxMetadataValueLength,
                                      what);
}

herr_t CollectAttrName(hid_t, const char* name, const H5A_info_t*, void* data) {
  auto* names = static_cast<std::vector<std::string>*>(data);
  if (names->size() > kMaxRootAttributes) return 1;  // stop: too many
  names->emplace_back(name);
  return 0;
}

absl::Status PlanRootAttribute(hid_t root, const std::string& name,
                               ImportPlan* plan) {
  const std::string what = absl::StrCat("root attribute '", Shown(name), "'");
  const std::string where = "root group";
  if (name == hdf5::kAttrStep) {
    CKPT_ASSIGN_OR_RETURN(plan->step,
                          hdf5::ReadUInt64Attribute(root, name, where));
    return absl::OkStatus();
  }
  if (name == hdf5::kAttrWorldSize) {
    CKPT_ASSIGN_OR_RETURN(plan->world_size,
                          hdf5::ReadUInt64Attribute(root, name, where));
    return absl::OkStatus();
  }
  if (name == hdf5::kAttrCheckpointId) {
    CKPT_ASSIGN_OR_RETURN(plan->checkpoint_id,
                          SmallStringAttr(root, name, where));
    return absl::OkStatus();
  }
  if (name == hdf5::kAttrFormatVersion) {
    CKPT_ASSIGN_OR_RETURN(plan->format_version,
                          SmallStringAttr(root, name, where));
    // Listed, so present: an attribute gone since reads as "".
    const std::string version = plan->format_version.value_or("");
    std::vector<absl::string_view> parts = absl::StrSplit(version, '.');
    uint32_t major = 0, minor = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &major) ||
        !absl::SimpleAtoi(parts[1], &minor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": '", Shown(version), "' is not a version MAJOR.MINOR"));
    }
    if (major != format::kFormatMajor) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": the file was written for ckpt format v", major,
                       ", this tool reads v", format::kFormatMajor));
    }
    return absl::OkStatus();
  }
  std::string key;
  const size_t prefix =
      std::char_traits<char>::length(hdf5::kReservedAttrPrefix);
  if (name.rfind(hdf5::kReservedAttrPrefix, 0) == 0) {
    if (name.compare(prefix, prefix, hdf5::kReservedAttrPrefix) != 0)
      return absl::OkStatus();
    key = name.substr(prefix);  // an escaped user key "ckpt_..."
  } else {
    key = name;
  }
  CKPT_RETURN_IF_ERROR(Annotate(format::ValidateMetadataKey(key), what));
  Handle attr(H5Aopen(root, name.c_str(), H5P_DEFAULT));
  if (!attr.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, what);
  CKPT_ASSIGN_OR_RETURN(std::string value, ReadMetadataValue(attr.get(), what));
  if (plan->metadata.size() >= format::kMaxMetadataEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("more than ", format::kMaxMetadataEntries,
                     " metadata attributes on the root group"));
  }
  plan->metadata.emplace_back(std::move(key), std::move(value));
  return absl::OkStatus();
}

absl::Status PlanRootAttributes(hid_t file, const PlanOptions& options,
                                ImportPlan* plan) {
  Handle root(H5Gopen2(file, "/", H5P_DEFAULT));
  if (!root.valid())
    return Hdf5Error(absl::StatusCode::kDataLoss, "opening the root group");
  Handle gcpl(H5Gget_create_plist(root.get()));
  unsigned order = 0;
  if (!gcpl.valid() || H5Pget_attr_creation_order(gcpl.get(), &order) < 0) {
    return Hdf5Error(absl::StatusCode::kDataLoss, "the root group");
  }
  const bool by_creation = (order & H5P_CRT_ORDER_TRACKED) != 0 &&
                           (order & H5P_CRT_ORDER_INDEXED) != 0;
  std::vector<std::string> names;
  hsize_t idx = 0;
  if (H5Aiterate2(root.get(), by_creation ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME,
                  by_creation ? H5_ITER_INC : H5_ITER_NATIVE, &idx,
                  CollectAttrName, &names) < 0) {
    return Hdf5Error(absl::StatusCode::kDataLoss,
                     "the root group's attributes");
  }
  if (!by_creation) std::sort(names.begin(), names.end());
  if (names.size() > kMaxRootAttributes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the root group has more than ", kMaxRootAttributes, " attributes"));
  }
  for (const std::string& name : names) {
    absl::Status s = PlanRootAttribute(root.get(), name, plan);
    if (s.ok()) continue;
    if (!options.skip_unsupported || !Skippable(s)) return s;
    plan->skipped.push_back(
        {absl::StrCat("/@", name), std::string(s.message())});
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<Box> FlatRangeBoxes(const Shape& shape, uint64_t start,
                                uint64_t count) {
  const size_t n = shape.size();
  std::vector<uint64_t> stride(n, 1);
  for (size_t i = n; i > 1; --i) stride[i - 2] = stride[i - 1] * shape[i - 1];
  std::vector<Box> boxes;
  const uint64_t end = start + count;
  while (start < end) {
    for (size_t d = 0; d < n; ++d) {
      if (start % stride[d] != 0 || end - start < stride[d]) continue;
      Box b;
      b.offset.resize(n);
      b.size.resize(n);
      for (size_t k = 0; k < n; ++k) {
        b.offset[k] = k <= d ? (start / stride[k]) % shape[k] : 0;
        b.size[k] = k < d ? 1 : shape[k];
      }
      b.size[d] = std::min((end - start) / stride[d], shape[d] - b.offset[d]);
      start += b.size[d] * stride[d];
      boxes.push_back(std::move(b));
      break;
    }
  }
  return boxes;
}

absl::StatusOr<ImportPlan> PlanImport(hid_t file, const PlanOptions& options) {
  ImportPlan plan;
  CKPT_RETURN_IF_ERROR(PlanRootAttributes(file, options, &plan));
  std::vector<std::string> paths;
  CKPT_RETURN_IF_ERROR(
      ListDatasets(file, &paths, &plan.skipped, options.skip_unsupported));
  absl::flat_hash_map<std::string, std::string> path_of;  // entry name -> path
  for (const std::string& path : paths) {
    absl::StatusOr<ImportPlanEntry> e = PlanDataset(file, path);
    absl::Status s = e.status();
    if (s.ok()) {
      auto [it, inserted] = path_of.emplace(e->name, path);
      if (!inserted) {
        s = absl::InvalidArgumentError(
            absl::StrCat(DatasetWhere(path), " and ", DatasetWhere(it->second),
                         " both map to entry '", e->name, "'"));
      }
    }
    if (!s.ok()) {
      if (!options.skip_unsupported || !Skippable(s)) return s;
      plan.skipped.push_back({path, std::string(s.message())});
      continue;
    }
    if (plan.entries.size() >= format::kMaxEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", format::kMaxEntries, " datasets"));
    }
    plan.logical_bytes += e->bytes;
    plan.entries.push_back(*std::move(e));
  }
  return plan;
}

absl::StatusOr<Handle> OpenHdf5File(const std::string& path) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (std::filesystem::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, not an HDF5 file"));
  }
#if H5_VERSION_GE(1, 12, 0)
  htri_t is_hdf5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
#endif
  if (is_hdf5 <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an HDF5 file"));
  }
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.valid() || H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) < 0) {
    return Hdf5Error(absl::StatusCode::kInternal, path);
  }
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!f.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, path);
  return f;
}

absl::StatusOr<Handle> OpenHdf5Image(absl::string_view bytes) {
  if (bytes.empty())
    return absl::InvalidArgumentError("file image: not an HDF5 file (empty)");
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.valid() || H5Pset_fapl_core(fapl.get(), 1 << 16, false) < 0 ||
      H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) < 0 ||
      H5Pset_file_image(fapl.get(), const_cast<char*>(bytes.data()),
                        bytes.size()) < 0) {
    return Hdf5Error(absl::StatusCode::kInternal, "file image");
  }
  // HDF5 takes two open core files of one name for the same file: every
  // image gets a name of its own.
  static std::atomic<uint64_t> images{0};
  const std::string name = absl::StrCat("ckpt-convert-image-", images++, ".h5");
  Handle f(H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!f.valid())
    return Hdf5Error(absl::StatusCode::kInvalidArgument, "file image");
  return f;
}

absl::Status ReadElements(hid_t file, const ImportPlanEntry& entry,
                          uint64_t start, uint64_t count, void* dst) {
  const std::string where = absl::StrCat(
      DatasetWhere(entry.path), " elements [", start, ", ", start + count, ")");
  if (count == 0) return absl::OkStatus();
  Handle ds(H5Dopen2(file, entry.path.c_str(), H5P_DEFAULT));
  if (!ds.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  Handle ftype(H5Dget_type(ds.get()));
  if (!ftype.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  CKPT_ASSIGN_OR_RETURN(Handle mem, hdf5::MemTypeFor(entry.mem, ftype.get()));
  herr_t rc;
  if (entry.shape.empty()) {
    rc = H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst);
  } else {
    Handle fspace(H5Dget_space(ds.get()));
    hsize_t n = count;
    Handle mspace(H5Screate_simple(1, &n, nullptr));
    if (!fspace.valid() || !mspace.valid())
      return Hdf5Error(absl::StatusCode::kDataLoss, where);
    bool first = true;
    for (const Box& b : FlatRangeBoxes(entry.shape, start, count)) {
      std::vector<hsize_t> off(b.offset.begin(), b.offset.end());
      std::vector<hsize_t> size(b.size.begin(), b.size.end());
      if (H5Sselect_hyperslab(fspace.get(),
                              first ? H5S_SELECT_SET : H5S_SELECT_OR,
                              off.data(), nullptr, size.data(), nullptr) < 0) {
        return Hdf5Error(absl::StatusCode::kInternal, where);
      }
      first = false;
    }
    rc = H5Dread(ds.get(), mem.get(), mspace.get(), fspace.get(), H5P_DEFAULT,
                 dst);
  }
  if (rc < 0) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  if (entry.dtype == DType::kBool) {
    const unsigned char* p = static_cast<const unsigned char*>(dst);
    for (uint64_t i = 0; i < count; ++i) {
      if (p[i] > 1) {
        return absl::DataLossError(absl::StrCat(
            DatasetWhere(entry.path), ": element ", start + i, " is ",
            static_cast<int>(p[i]), ", not a bool (0 or 1)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadObjectBytes(hid_t file,
                                            const ImportPlanEntry& entry) {
  const std::string where = DatasetWhere(entry.path);
  std::string out(entry.bytes, '\0');
  if (entry.bytes == 0) return out;
  Handle ds(H5Dopen2(file, entry.path.c_str(), H5P_DEFAULT));
  if (!ds.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  Handle ftype(H5Dget_type(ds.get()));
  if (!ftype.valid()) return Hdf5Error(absl::StatusCode::kDataLoss, where);
  CKPT_ASSIGN_OR_RETURN(Handle mem, hdf5::MemTypeFor(entry.mem, ftype.get()));
  if (H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) <
      0) {
    return Hdf5Error(absl::StatusCode::kDataLoss, where);
  }
  return out;
}

}  // namespace ckpt::interop
