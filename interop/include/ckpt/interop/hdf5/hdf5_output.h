// The HDF5 file driver of ckpt-convert --to hdf5: POSIX pread/pwrite like
// HDF5's default ("sec2") driver, except that an I/O error never reaches
// HDF5.
//
// Why: when a write fails (a full disk, EFBIG), HDF5 1.10 can leave the
// file half closed: H5Fclose fails while flushing, the identifier stays
// registered, and libhdf5's exit handler (H5_term_library) then crashes
// closing it again. With this driver the first failed write or truncate is
// recorded in an OutputState, and it and every later write of that file are
// discarded while HDF5 is told they succeeded, so HDF5's state stays
// consistent and the file always closes cleanly. The caller checks the
// OutputState after each step and fails with the recorded errno (the output
// is a temporary file that is then removed).
#ifndef CKPT_INTEROP_HDF5_HDF5_OUTPUT_H_
#define CKPT_INTEROP_HDF5_HDF5_OUTPUT_H_

#include <hdf5.h>

#include <atomic>

#include "absl/status/status.h"

namespace ckpt::interop::hdf5 {

// What the driver saw of one output file. Owned by the caller; must outlive
// every file opened with it. Thread-safe.
class OutputState {
 public:
  // The errno of the first failed write, truncate or sync; 0 if none.
  int error() const { return errno_.load(); }
  // Records `err` unless an error was recorded before (called by the
  // driver).
  void Record(int err) {
    int none = 0;
    errno_.compare_exchange_strong(none, err);
  }

 private:
  std::atomic<int> errno_{0};
};

// Makes `fapl` (a file access property list) open files with this driver,
// reporting to `*state`. InternalError if the driver cannot be registered.
// REQUIRES: the Hdf5Lock is held.
absl::Status SetOutputDriver(hid_t fapl, OutputState* state);

}  // namespace ckpt::interop::hdf5

#endif  // CKPT_INTEROP_HDF5_HDF5_OUTPUT_H_
