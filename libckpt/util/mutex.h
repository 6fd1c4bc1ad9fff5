// The one mutex type of ckpt (libckpt, tools, gpu and the test doubles;
// not installed): a std::mutex with clang's thread-safety annotations, a
// scoped lock and a condition variable.
//
// Why not absl::Mutex: Debian's libabsl is not built with ThreadSanitizer,
// so TSan does not see its lock and unlock and reports races on the data it
// guards. Why not a bare std::mutex: libstdc++'s carries no annotations, so
// clang's -Wthread-safety (scripts/clang-check, in CI) checks nothing about
// it. This wrapper is both: TSan sees the pthread mutex underneath, and
// members marked ABSL_GUARDED_BY(mu_) are checked at compile time.
//
// Usage:
//   ckpt::Mutex mu_;
//   int count_ ABSL_GUARDED_BY(mu_) = 0;
//   ckpt::CondVar changed_;
//   ...
//   ckpt::MutexLock l(&mu_);
//   while (count_ == 0) changed_.Wait(&mu_);
//
// Condition-variable waits take no predicate: the loop stays in the caller,
// where the analysis can see that the guarded state is read under the lock
// (it does not look into lambdas).
#ifndef CKPT_LIBCKPT_UTIL_MUTEX_H_
#define CKPT_LIBCKPT_UTIL_MUTEX_H_

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace ckpt {

// A non-recursive exclusive lock. Not copyable or movable. Thread-safe.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // REQUIRES: the calling thread does not hold the lock.
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // REQUIRES: the calling thread holds the lock.
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `*mu` from construction to destruction. `mu` must outlive it.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable used with a ckpt::Mutex. Waits may wake spuriously:
// callers re-check their condition in a loop. Thread-safe.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases `*mu`, blocks until signalled (or a spurious wake-up) and takes
  // `*mu` again before returning. REQUIRES: the caller holds `*mu`.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();  // still held, and owned by the caller again
  }
  // Wakes one waiter (Signal) or all of them (SignalAll). The caller need
  // not hold the mutex.
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ckpt

#endif  // CKPT_LIBCKPT_UTIL_MUTEX_H_
