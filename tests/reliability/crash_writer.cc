// ckpt_crash_writer: a training job in miniature for the reliability tests.
// Ranks are threads of this process (InProcessWorld); each saves the state
// of tests/reliability/model.h for steps first, first + stride, ... into one
// root, as a trainer would, until `count` saves are done (0: forever, until
// it is killed).
//
//   ckpt_crash_writer --root DIR --first N [--count K] [--stride S]
//       [--world W] [--scale S] [--keep-last K] [--io-threads T]
//       [--fsize-limit BYTES] [--async 1]
//
// After each committed save it prints "saved <step>" on stdout (flushed), so
// a test knows which steps must have survived a kill. A failed save prints
// "status: <CODE>: <message>" and exits 2; bad arguments exit 64.
// --fsize-limit sets RLIMIT_FSIZE and ignores SIGXFSZ first, so that writes
// past the limit fail with EFBIG. --async 1 saves with Writer::SaveAsync
// and overwrites the whole state while each save is in flight (the
// checkpoint must still hold the values of its step).
//
// An s3:// root is saved through ckpt::UrlStorage(), configured by the AWS
// environment variables (ckpt/open_storage.h), when the writer is built
// with ckpt_s3 (CKPT_CRASH_WRITER_S3); without it such a root is refused
// (exit 64).
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "ckpt/in_process.h"
#include "reliability/model.h"
#ifdef CKPT_CRASH_WRITER_S3
#include "ckpt/open_storage.h"
#endif

namespace {

struct Args {
  std::string root;
  uint64_t first = 0;
  bool have_first = false;
  uint64_t count = 0;
  uint64_t stride = 1;
  int world = 4;
  ckpt::reliability::SaveConfig save;
  uint64_t fsize_limit = 0;
  bool async = false;
};

int Usage(const char* why) {
  std::fprintf(
      stderr,
      "ckpt_crash_writer: %s\nusage: ckpt_crash_writer --root DIR --first N "
      "[--count K] [--stride S] [--world W] [--scale S] [--keep-last K] "
      "[--io-threads T] [--fsize-limit BYTES] [--async 1]\n",
      why);
  return 64;
}

bool ParseArgs(int argc, char** argv, Args* a, std::string* why) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      *why = "missing value for " + flag;
      return false;
    }
    const char* v = argv[++i];
    uint64_t n = 0;
    const bool num = absl::SimpleAtoi(v, &n);
    if (flag == "--root") {
      a->root = v;
      continue;
    }
    if (!num) {
      *why = "bad number for " + flag + ": " + v;
      return false;
    }
    if (flag == "--first") {
      a->first = n;
      a->have_first = true;
    } else if (flag == "--count") {
      a->count = n;
    } else if (flag == "--stride") {
      a->stride = n;
    } else if (flag == "--world") {
      a->world = static_cast<int>(n);
    } else if (flag == "--scale") {
      a->save.scale = static_cast<int>(n);
    } else if (flag == "--keep-last") {
      a->save.keep_last = static_cast<int>(n);
    } else if (flag == "--io-threads") {
      a->save.io_threads = static_cast<int>(n);
    } else if (flag == "--fsize-limit") {
      a->fsize_limit = n;
    } else if (flag == "--async") {
      a->async = n != 0;
    } else {
      *why = "unknown flag " + flag;
      return false;
    }
  }
  if (a->root.empty() || !a->have_first) {
    *why = "--root and --first are required";
    return false;
  }
  if (a->world < 1 || a->world > 64 || a->stride < 1) {
    *why = "--world must be 1..64 and --stride >= 1";
    return false;
  }
#ifndef CKPT_CRASH_WRITER_S3
  if (absl::StartsWith(a->root, "s3://")) {
    *why = "built without ckpt_s3: s3:// roots are not supported";
    return false;
  }
#endif
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string why;
  if (!ParseArgs(argc, argv, &args, &why)) return Usage(why.c_str());
  if (args.fsize_limit > 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    rl.rlim_cur = args.fsize_limit;
    rl.rlim_max = args.fsize_limit;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) {
      std::fprintf(stderr, "setrlimit(RLIMIT_FSIZE): %s\n",
                   std::strerror(errno));
      return 1;
    }
  }

  ckpt::Storage* storage = nullptr;  // the Writer's default: POSIX
#ifdef CKPT_CRASH_WRITER_S3
  if (absl::StartsWith(args.root, "s3://")) storage = ckpt::UrlStorage();
#endif

  ckpt::InProcessWorld world(args.world);
  absl::Status s =
      ckpt::RunRanks(world, [&](ckpt::Communicator& comm) -> absl::Status {
        CKPT_ASSIGN_OR_RETURN(auto state, ckpt::reliability::RankState::Create(
                                              &comm, args.save.scale, storage));
        for (uint64_t i = 0; args.count == 0 || i < args.count; ++i) {
          const uint64_t step = args.first + i * args.stride;
          CKPT_RETURN_IF_ERROR(
              (args.async
                   ? state->SaveAsyncAndTrainOn(args.root, step, args.save)
                   : state->Save(args.root, step, args.save))
                  .status());
          if (comm.rank() == 0) {
            std::printf("saved %llu\n", static_cast<unsigned long long>(step));
            std::fflush(stdout);
          }
        }
        return absl::OkStatus();
      });
  if (!s.ok()) {
    std::printf("status: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
                std::string(s.message()).c_str());
    std::fflush(stdout);
    return 2;
  }
  return 0;
}
