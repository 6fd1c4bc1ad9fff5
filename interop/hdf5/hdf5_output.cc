#include "ckpt/interop/hdf5/hdf5_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ckpt/interop/hdf5/hdf5_util.h"

namespace ckpt::interop::hdf5 {
namespace {

// The driver's part of a file access property list (copied by HDF5).
struct DriverInfo {
  OutputState* state;
};

// One open file. HDF5 allocates nothing of it: open() makes it, close()
// frees it. `pub` must be the first member (HDF5 sees an H5FD_t*).
struct OutputFile {
  H5FD_t pub;
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  haddr_t eoa = 0;  // end of the address space HDF5 allocated
  haddr_t eof = 0;  // end of what was written (or discarded)
  OutputState* state = nullptr;
};

constexpr haddr_t kMaxAddr = (static_cast<haddr_t>(1) << 62) - 1;

OutputFile* Of(H5FD_t* f) { return reinterpret_cast<OutputFile*>(f); }
const OutputFile* Of(const H5FD_t* f) {
  return reinterpret_cast<const OutputFile*>(f);
}

// A failure of open, close or read (not of writing): reported to HDF5.
herr_t Fail(const char* what) {
  H5Epush2(H5E_DEFAULT, __FILE__, what, __LINE__, H5E_ERR_CLS, H5E_VFL,
           H5E_CANTOPENFILE, "%s", std::strerror(errno));
  return -1;
}

H5FD_t* Open(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  const DriverInfo* info =
      static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  if (info == nullptr || info->state == nullptr) return nullptr;
  int oflags = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) oflags |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) oflags |= O_CREAT;
  if (flags & H5F_ACC_EXCL) oflags |= O_EXCL;
  const int fd = ::open(name, oflags | O_CLOEXEC, 0666);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    Fail("open");
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  auto* f = new OutputFile;
  std::memset(&f->pub, 0, sizeof(f->pub));
  f->fd = fd;
  f->dev = st.st_dev;
  f->ino = st.st_ino;
  f->eof = static_cast<haddr_t>(st.st_size);
  f->state = info->state;
  (void)maxaddr;
  return &f->pub;
}

herr_t Close(H5FD_t* file) {
  OutputFile* f = Of(file);
  const int rc = ::close(f->fd);
  if (rc != 0) f->state->Record(errno);
  delete f;
  return 0;
}

int Compare(const H5FD_t* a, const H5FD_t* b) {
  const OutputFile* x = Of(a);
  const OutputFile* y = Of(b);
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

herr_t Query(const H5FD_t*, unsigned long* flags) {
  // As HDF5's sec2 driver: metadata and small raw data are aggregated and
  // accumulated, raw data sieved.
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA |
           H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t GetEoa(const H5FD_t* file, H5FD_mem_t) { return Of(file)->eoa; }
herr_t SetEoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  Of(file)->eoa = addr;
  return 0;
}
haddr_t GetEof(const H5FD_t* file, H5FD_mem_t) { return Of(file)->eof; }

herr_t GetHandle(H5FD_t* file, hid_t, void** handle) {
  *handle = &Of(file)->fd;
  return 0;
}

// Bytes past the end of the file read as zeros, as with sec2.
herr_t Read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size,
            void* buf) {
  OutputFile* f = Of(file);
  char* p = static_cast<char*>(buf);
  while (size > 0) {
    const ssize_t n = ::pread(f->fd, p, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail("read");
    if (n == 0) break;
    p += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<size_t>(n);
  }
  std::memset(p, 0, size);
  return 0;
}

// After the first error nothing more is written (see the header).
herr_t Write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size,
             const void* buf) {
  OutputFile* f = Of(file);
  f->eof = std::max(f->eof, addr + size);
  const char* p = static_cast<const char*>(buf);
  while (size > 0 && f->state->error() == 0) {
    const ssize_t n = ::pwrite(f->fd, p, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      f->state->Record(n < 0 ? errno : EIO);
      break;
    }
    p += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<size_t>(n);
  }
  return 0;
}

herr_t Truncate(H5FD_t* file, hid_t, hbool_t) {
  OutputFile* f = Of(file);
  if (f->eoa != f->eof && f->state->error() == 0 &&
      ::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0) {
    f->state->Record(errno);
  }
  f->eof = f->eoa;
  return 0;
}

H5FD_class_t MakeClass() {
  H5FD_class_t c;
  std::memset(&c, 0, sizeof(c));
  c.name = "ckpt_output";
  c.maxaddr = kMaxAddr;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.fapl_size = sizeof(DriverInfo);
  c.open = Open;
  c.close = Close;
  c.cmp = Compare;
  c.query = Query;
  c.get_eoa = GetEoa;
  c.set_eoa = SetEoa;
  c.get_eof = GetEof;
  c.get_handle = GetHandle;
  c.read = Read;
  c.write = Write;
  c.truncate = Truncate;
  const H5FD_mem_t map[] = H5FD_FLMAP_DICHOTOMY;
  std::copy(std::begin(map), std::end(map), std::begin(c.fl_map));
  return c;
}

}  // namespace

absl::Status SetOutputDriver(hid_t fapl, OutputState* state) {
  // Registered once per process (under the Hdf5Lock); HDF5 keeps the class.
  static const H5FD_class_t kClass = MakeClass();
  static hid_t driver = H5I_INVALID_HID;
  if (driver < 0 || H5Iis_valid(driver) <= 0) driver = H5FDregister(&kClass);
  const DriverInfo info{state};
  if (driver < 0 || H5Pset_driver(fapl, driver, &info) < 0) {
    return Hdf5Error(absl::StatusCode::kInternal,
                     "setting up the output file driver");
  }
  return absl::OkStatus();
}

}  // namespace ckpt::interop::hdf5
