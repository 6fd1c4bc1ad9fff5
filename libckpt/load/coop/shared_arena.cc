#include "load/coop/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kHeader = 64;  // the cookie, then padding
constexpr size_t kCookie = 16;
constexpr uint64_t kAlign = 64;

// What a rank tells the others about its segment.
struct Offer {
  bool ok = false;
  uint64_t size = 0;  // of the whole segment
  uint64_t half = 0;
  std::string cookie;  // kCookie bytes
  std::string name;    // for shm_open
};

std::string RandomBytes(size_t n) {
  std::random_device rd;
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rd() & 0xff);
  return out;
}

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string Encode(const Offer& o) {
  std::string out;
  format::PutFixed32(&out, o.ok ? 1 : 0);
  format::PutFixed64(&out, o.size);
  format::PutFixed64(&out, o.half);
  format::PutString(&out, o.cookie);
  format::PutString(&out, o.name);
  return out;
}

absl::StatusOr<Offer> Decode(absl::string_view bytes) {
  format::ByteReader r(bytes);
  Offer o;
  CKPT_ASSIGN_OR_RETURN(uint32_t ok, r.Read32("ok"));
  o.ok = ok != 0;
  CKPT_ASSIGN_OR_RETURN(o.size, r.Read64("size"));
  CKPT_ASSIGN_OR_RETURN(o.half, r.Read64("half"));
  CKPT_ASSIGN_OR_RETURN(absl::string_view cookie, r.ReadString("cookie", 64));
  CKPT_ASSIGN_OR_RETURN(absl::string_view name, r.ReadString("name", 255));
  o.cookie.assign(cookie.data(), cookie.size());
  o.name.assign(name.data(), name.size());
  return o;
}

// Creates, reserves and maps this rank's segment; `o` describes it (o.ok
// false, nothing left behind, when any step fails).
char* CreateSegment(uint64_t half_bytes, Offer* o) {
  o->half = (std::max<uint64_t>(half_bytes, 1) + kAlign - 1) / kAlign * kAlign;
  o->size = kHeader + 2 * o->half;
  o->cookie = RandomBytes(kCookie);
  o->name = absl::StrCat("/ckpt-coop-", getpid(), "-", Hex(RandomBytes(8)));
  const int fd = shm_open(o->name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  void* base = MAP_FAILED;
  if (posix_fallocate(fd, 0, static_cast<off_t>(o->size)) == 0) {
    base = mmap(nullptr, o->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(o->name.c_str());
    return nullptr;
  }
  std::memcpy(base, o->cookie.data(), kCookie);
  o->ok = true;
  return static_cast<char*>(base);
}

// Maps another rank's segment read-only and checks its cookie; null when
// it cannot (another machine's segment does not exist here).
char* MapPeer(const Offer& o) {
  const int fd = shm_open(o.name.c_str(), O_RDONLY, 0);
  if (fd < 0) return nullptr;
  struct stat st;
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == o.size) {
    base = mmap(nullptr, o.size, PROT_READ, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  if (std::memcmp(base, o.cookie.data(), kCookie) != 0) {
    munmap(base, o.size);
    return nullptr;
  }
  return static_cast<char*>(base);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedArenas>> SharedArenas::Create(
    Communicator* comm, uint64_t half_bytes, bool wanted) {
  const uint32_t me = comm->rank(), n = comm->size();
  std::unique_ptr<SharedArenas> out(new SharedArenas(me));
  out->maps_.resize(n);
  Offer mine;
  if (wanted) {
    char* base = CreateSegment(half_bytes, &mine);
    if (base != nullptr) out->maps_[me] = Mapping{base, mine.size, mine.half};
  }
  absl::StatusOr<std::vector<std::string>> all = comm->AllGather(Encode(mine));
  bool usable = all.ok() && mine.ok;
  for (uint32_t r = 0; r < n && usable; ++r) {
    if (r == me) continue;
    absl::StatusOr<Offer> o = Decode((*all)[r]);
    char* base = o.ok() && o->ok ? MapPeer(*o) : nullptr;
    if (base == nullptr) {
      usable = false;
      break;
    }
    out->maps_[r] = Mapping{base, o->size, o->half};
  }
  std::vector<int64_t> failed = {usable ? 0 : 1};
  const absl::Status agreed =
      all.ok() ? comm->AllReduceMax(&failed) : all.status();
  // Past the agreement every rank that could map this segment has: its
  // name goes now, whatever happened.
  if (mine.ok) shm_unlink(mine.name.c_str());
  CKPT_RETURN_IF_ERROR(agreed);
  if (failed[0] != 0) return nullptr;
  return out;
}

SharedArenas::~SharedArenas() {
  for (const Mapping& m : maps_) {
    if (m.base != nullptr) munmap(m.base, m.size);
  }
}

char* SharedArenas::Mine(uint32_t half) const {
  const Mapping& m = maps_[me_];
  return m.base + kHeader + half * m.half;
}

const char* SharedArenas::Of(uint32_t rank, uint32_t half) const {
  const Mapping& m = maps_[rank];
  return m.base + kHeader + half * m.half;
}

}  // namespace ckpt::internal
