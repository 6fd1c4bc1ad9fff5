#include "ckpt/interop/torch_zip.h"

#include <zlib.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::interop {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50,
                   kEndSig = 0x06054b50, kEnd64Sig = 0x06064b50,
                   kLocator64Sig = 0x07064b50;
constexpr size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22;

uint64_t Le(absl::string_view d, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | static_cast<uint8_t>(d[at + i]);
  return v;
}

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("zip: ", what));
}

struct End {
  uint64_t count = 0, cd_size = 0, cd_offset = 0;
  size_t at = 0;  // offset of the end record
};

absl::StatusOr<End> FindEnd(absl::string_view d) {
  if (d.size() < kEndSize)
    return Bad("too short for an end of central directory");
  const size_t lowest =
      d.size() > 0xffff + kEndSize ? d.size() - 0xffff - kEndSize : 0;
  for (size_t at = d.size() - kEndSize + 1; at-- > lowest;) {
    if (Le(d, at, 4) != kEndSig ||
        at + kEndSize + Le(d, at + 20, 2) != d.size())
      continue;
    End e;
    e.at = at;
    if (Le(d, at + 4, 2) != 0 || Le(d, at + 6, 2) != 0)
      return Bad("multi-disk archive");
    e.count = Le(d, at + 10, 2);
    e.cd_size = Le(d, at + 12, 4);
    e.cd_offset = Le(d, at + 16, 4);
    if (e.count != 0xffff && e.cd_size != 0xffffffff &&
        e.cd_offset != 0xffffffff)
      return e;
    // Zip64: the locator sits just before the end record.
    if (at < 20 || Le(d, at - 20, 4) != kLocator64Sig)
      return Bad("zip64 locator missing");
    const uint64_t r = Le(d, at - 20 + 8, 8);
    if (r > at - 20 || at - 20 - r < 56 || Le(d, r, 4) != kEnd64Sig) {
      return Bad("zip64 end of central directory missing");
    }
    e.count = Le(d, r + 32, 8);
    e.cd_size = Le(d, r + 40, 8);
    e.cd_offset = Le(d, r + 48, 8);
    e.at = r;
    return e;
  }
  return Bad("no end of central directory record");
}

// Reads the zip64 extra field of a central header for the fields that are
// 0xffffffff.
absl::Status ReadZip64Extra(absl::string_view extra, uint64_t& usize,
                            uint64_t& csize, uint64_t& offset) {
  size_t p = 0;
  while (p + 4 <= extra.size()) {
    const uint64_t id = Le(extra, p, 2), len = Le(extra, p + 2, 2);
    if (p + 4 + len > extra.size())
      return Bad("extra field runs past its header");
    if (id == 1) {
      size_t q = p + 4;
      for (uint64_t* f : {&usize, &csize, &offset}) {
        if (*f != 0xffffffff) continue;
        if (q + 8 > p + 4 + len) return Bad("zip64 extra field too short");
        *f = Le(extra, q, 8);
        q += 8;
      }
    }
    p += 4 + len;
  }
  return absl::OkStatus();
}

struct Span {
  uint64_t begin, end;
  const std::string* name;
};

absl::StatusOr<ZipEntry> ReadCentral(absl::string_view d, uint64_t& p,
                                     uint64_t cd_end,
                                     std::vector<Span>& spans) {
  if (p + kCentralSize > cd_end || Le(d, p, 4) != kCentralSig) {
    return Bad(absl::StrCat("central directory header at offset ", p,
                            " is malformed"));
  }
  const uint64_t flags = Le(d, p + 8, 2), method = Le(d, p + 10, 2);
  uint64_t csize = Le(d, p + 20, 4), usize = Le(d, p + 24, 4),
           local = Le(d, p + 42, 4);
  const uint64_t nlen = Le(d, p + 28, 2), xlen = Le(d, p + 30, 2),
                 clen = Le(d, p + 32, 2);
  if (p + kCentralSize + nlen + xlen + clen > cd_end)
    return Bad("central header past its end");
  ZipEntry e;
  e.name = std::string(d.substr(p + kCentralSize, nlen));
  e.crc32 = static_cast<uint32_t>(Le(d, p + 16, 4));
  CKPT_RETURN_IF_ERROR(ReadZip64Extra(d.substr(p + kCentralSize + nlen, xlen),
                                      usize, csize, local));
  p += kCentralSize + nlen + xlen + clen;
  const std::string where =
      absl::StrCat("entry '", format::EscapeText(e.name), "'");
  if (flags & 1)
    return absl::FailedPreconditionError(
        absl::StrCat("zip: ", where, " is encrypted"));
  if (method != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("zip: ", where, " is compressed (method ", method,
                     "); torch.save stores entries"));
  }
  if (csize != usize)
    return Bad(absl::StrCat(where, ": stored size ", csize, " != ", usize));
  if (local > d.size() || d.size() - local < kLocalSize ||
      Le(d, local, 4) != kLocalSig) {
    return Bad(absl::StrCat(where, ": no local header at offset ", local));
  }
  const uint64_t lnlen = Le(d, local + 26, 2), lxlen = Le(d, local + 28, 2);
  if (Le(d, local + 8, 2) != method || local + kLocalSize + lnlen > d.size() ||
      d.substr(local + kLocalSize, lnlen) != e.name) {
    return Bad(absl::StrCat(
        where, ": local header disagrees with the central directory"));
  }
  e.data_offset = local + kLocalSize + lnlen + lxlen;
  e.size = usize;
  if (e.data_offset > d.size() || e.size > d.size() - e.data_offset) {
    return Bad(absl::StrCat(where, ": data [", e.data_offset, ", +", e.size,
                            ") runs past the archive (", d.size(), " bytes)"));
  }
  spans.push_back({local, e.data_offset + e.size, nullptr});
  return e;
}

}  // namespace

const ZipEntry* ZipArchive::Find(absl::string_view name) const {
  for (const ZipEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<ZipArchive> ParseZip(absl::string_view d) {
  CKPT_ASSIGN_OR_RETURN(End end, FindEnd(d));
  if (end.cd_offset > end.at || end.cd_size > end.at - end.cd_offset) {
    return Bad("central directory lies outside the archive");
  }
  if (end.count > kZipMaxEntries || end.count > end.cd_size / kCentralSize) {
    return Bad(
        absl::StrCat(end.count, " entries do not fit the central directory"));
  }
  ZipArchive zip;
  std::vector<Span> spans;
  std::set<std::string> names;
  uint64_t p = end.cd_offset;
  const uint64_t cd_end = end.cd_offset + end.cd_size;
  for (uint64_t i = 0; i < end.count; ++i) {
    CKPT_ASSIGN_OR_RETURN(ZipEntry e, ReadCentral(d, p, cd_end, spans));
    if (!names.insert(e.name).second)
      return Bad(
          absl::StrCat("entry '", format::EscapeText(e.name), "' twice"));
    zip.entries.push_back(std::move(e));
  }
  for (size_t i = 0; i < spans.size(); ++i)
    spans[i].name = &zip.entries[i].name;
  spans.push_back({end.cd_offset, cd_end, nullptr});
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      auto label = [](const Span& s) {
        return s.name
                   ? absl::StrCat("entry '", format::EscapeText(*s.name), "'")
                   : std::string("central directory");
      };
      return Bad(
          absl::StrCat(label(spans[i]), " overlaps ", label(spans[i - 1])));
    }
  }
  return zip;
}

absl::Status VerifyZipEntry(absl::string_view data, const ZipEntry& e) {
  uLong crc = crc32(0L, Z_NULL, 0);
  absl::string_view bytes = data.substr(e.data_offset, e.size);
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()),
                static_cast<uInt>(n));
    bytes.remove_prefix(n);
  }
  if (crc != e.crc32) {
    return Bad(absl::StrFormat(
        "entry '%s': CRC-32 0x%08x != 0x%08x (stored != computed)",
        format::EscapeText(e.name), e.crc32, crc));
  }
  return absl::OkStatus();
}

const ZipEntry* TorchRecord::Storage(const ZipArchive& zip,
                                     absl::string_view key) const {
  return zip.Find(absl::StrCat(prefix, "/data/", key));
}

absl::StatusOr<TorchRecord> FindTorchRecord(const ZipArchive& zip) {
  TorchRecord r;
  for (const ZipEntry& e : zip.entries) {
    if (absl::EndsWith(e.name, "/data.pkl") &&
        e.name.find('/') == e.name.size() - std::string("/data.pkl").size()) {
      r.prefix = e.name.substr(0, e.name.size() - 9);
      r.pickle = &e;
    }
  }
  if (r.pickle == nullptr)
    return Bad("no <dir>/data.pkl: not a torch.save record");
  for (const ZipEntry& e : zip.entries) {
    if (!absl::StartsWith(e.name, r.prefix + "/")) {
      return Bad(absl::StrCat("entry '", format::EscapeText(e.name),
                              "' is outside '", format::EscapeText(r.prefix),
                              "/'"));
    }
  }
  r.version = zip.Find(r.prefix + "/version");
  return r;
}

}  // namespace ckpt::interop
