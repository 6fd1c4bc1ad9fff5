// ckpt-bench-io --storage s3://bucket/prefix: counts, not speeds (issue 26,
// item 5). Requests, bytes sent and received and parts per shard of a save,
// a cooperative resharded load and a replicated load against an S3 store
// (the loopback moto server in the tests), each from the client's request
// log (s3/s3_client.h's RequestObserver), checked against the targets:
//   - the save sends at most 1.01x the checkpoint's bytes;
//   - a cooperative resharded load receives at most 1.05x the bytes it
//     needs (every stored byte of the checkpoint, read once by the job);
//   - no data request (a part, a shard PUT, a ranged GET) under 1 MiB but
//     the last piece of an object; metadata (MANIFEST, latest, markers,
//     shard headers, the XML of S3) apart.
// The store is configured by the AWS environment variables
// (ckpt/open_storage.h). Times are printed but are not the point: the
// server is a Python process on the same machine.
#ifndef CKPT_BENCH_BENCH_IO_S3_H_
#define CKPT_BENCH_BENCH_IO_S3_H_

#include <string>

namespace ckpt::bench {

struct S3CountsOptions {
  std::string url;  // s3://bucket[/prefix]; what is written is removed
  double gib = 0.0625;
  int ranks = 2;       // ranks of the save and of the replicated load
  int reshard_to = 3;  // ranks of the cooperative resharded load
  int threads = 4;     // I/O threads of each rank
  int part_mib = 16;   // multipart part size, >= 5
  bool create_bucket = false;
};

// Runs the three phases, prints a line per phase and, last, one JSON
// object (bench/README.md). Returns the process's exit code: 0, or 2 on an
// error (printed on stderr).
int RunS3Counts(const S3CountsOptions& options);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_BENCH_IO_S3_H_
