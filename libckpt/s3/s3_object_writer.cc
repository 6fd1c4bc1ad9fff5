#include "s3/s3_object_writer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::s3 {

absl::StatusOr<std::unique_ptr<ObjectWriter>> ObjectWriter::Create(
    S3Client* client, std::string bucket, std::string key,
    const ObjectWriterOptions& options) {
  if (options.part_size < kMinPartSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("part size ", options.part_size,
                     " is below S3's minimum of ", kMinPartSize, " bytes"));
  }
  if (options.upload_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload_threads must be >= 1, not ", options.upload_threads));
  }
  return std::unique_ptr<ObjectWriter>(
      new ObjectWriter(client, std::move(bucket), std::move(key), options));
}

ObjectWriter::ObjectWriter(S3Client* client, std::string bucket,
                           std::string key, const ObjectWriterOptions& options)
    : client_(client),
      bucket_(std::move(bucket)),
      key_(std::move(key)),
      options_(options) {}

ObjectWriter::~ObjectWriter() {
  bool done;
  {
    MutexLock l(&mu_);
    done = committed_;
  }
  if (!done) (void)Abort();
  StopUploads();
}

std::string ObjectWriter::Where() const {
  return absl::StrCat("s3://", bucket_, "/", key_);
}

absl::Status ObjectWriter::Fail(absl::Status s) {
  MutexLock l(&mu_);
  if (error_.ok()) error_ = s;
  changed_.SignalAll();
  return error_;
}

absl::Status ObjectWriter::PWrite(uint64_t offset, absl::string_view data) {
  const uint64_t ps = options_.part_size;
  if (data.empty()) return absl::OkStatus();
  const uint64_t end = offset + data.size();
  if (end < offset || (end - 1) / ps >= static_cast<uint64_t>(kMaxParts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), ": a write up to byte ", end, " makes the object larger than ",
        kMaxParts, " parts of ", ps, " bytes"));
  }
  MutexLock l(&mu_);
  while (offset < end) {
    if (!error_.ok()) return error_;
    if (closed_) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(), ": write after Close or Abort"));
    }
    const int index = static_cast<int>(offset / ps);
    const uint64_t in_part = offset - index * ps;
    const uint64_t n = std::min(end - offset, ps - in_part);
    if (static_cast<size_t>(index) < handed_off_.size() && handed_off_[index]) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(), ": bytes [", offset, ", ", offset + n, ") belong to part ",
          index + 1, ", which is already uploaded"));
    }
    Part& part = buffering_[index];
    if (part.data.empty()) part.data.assign(ps, '\0');
    // Copy without the lock: the part stays while `writers` > 0.
    ++part.writers;
    char* dst = part.data.data() + in_part;
    mu_.Unlock();
    std::memcpy(dst, data.data() + (offset - (end - data.size())), n);
    mu_.Lock();
    --part.writers;
    // Merge [in_part, in_part + n) into the covered intervals.
    uint64_t b = in_part, e = in_part + n;
    auto it = part.covered.upper_bound(b);
    if (it != part.covered.begin() && std::prev(it)->second >= b) --it;
    while (it != part.covered.end() && it->first <= e) {
      b = std::min(b, it->first);
      e = std::max(e, it->second);
      part.covered_bytes -= it->second - it->first;
      it = part.covered.erase(it);
    }
    part.covered.emplace(b, e);
    part.covered_bytes += e - b;
    end_ = std::max(end_, offset + n);
    offset += n;
    if (part.covered_bytes == ps && part.writers == 0) {
      std::string bytes = std::move(part.data);
      buffering_.erase(index);
      Enqueue(index, std::move(bytes));
      // Back-pressure: as many parts wait as upload.
      while (error_.ok() && in_flight_ > 2 * options_.upload_threads) {
        changed_.Wait(&mu_);
      }
    }
  }
  return error_;
}

void ObjectWriter::Enqueue(int index, std::string data) {
  if (handed_off_.size() <= static_cast<size_t>(index)) {
    handed_off_.resize(index + 1, false);
  }
  handed_off_[index] = true;
  queue_.push_back(Upload{index, std::move(data)});
  ++in_flight_;
  if (threads_.empty()) {
    for (int i = 0; i < options_.upload_threads; ++i) {
      threads_.emplace_back([this] { UploadLoop(); });
    }
  }
  changed_.SignalAll();
}

void ObjectWriter::UploadLoop() {
  MutexLock l(&mu_);
  while (true) {
    while (queue_.empty() && !stopping_) changed_.Wait(&mu_);
    if (queue_.empty()) return;
    Upload job = std::move(queue_.front());
    queue_.pop_front();
    // The upload is created by the first thread that needs it.
    while (upload_id_.empty() && creating_upload_) changed_.Wait(&mu_);
    if (upload_id_.empty() && error_.ok()) {
      creating_upload_ = true;
      mu_.Unlock();
      auto id = client_->CreateMultipartUpload(bucket_, key_);
      mu_.Lock();
      creating_upload_ = false;
      if (id.ok()) {
        upload_id_ = *id;
      } else if (error_.ok()) {
        error_ = id.status();
      }
      changed_.SignalAll();
    }
    if (error_.ok()) {
      const std::string upload_id = upload_id_;
      mu_.Unlock();
      auto etag = client_->UploadPart(bucket_, key_, upload_id, job.index + 1,
                                      job.data);
      mu_.Lock();
      if (etag.ok()) {
        completed_.push_back({job.index + 1, *etag});
      } else if (error_.ok()) {
        error_ = etag.status();
      }
    }
    --in_flight_;
    changed_.SignalAll();
  }
}

void ObjectWriter::StopUploads() {
  std::vector<std::thread> threads;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    changed_.SignalAll();
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

absl::Status ObjectWriter::Close() {
  std::string whole;  // the whole object, when it goes up in one PUT
  bool one_put = false;
  {
    MutexLock l(&mu_);
    if (closed_) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(), ": closed twice"));
    }
    closed_ = true;
    one_put = TakeWholeObject(&whole);
    if (!one_put && error_.ok()) FlushParts();
  }
  if (one_put) return PutWholeObject(whole);
  return CompleteUpload();
}

bool ObjectWriter::TakeWholeObject(std::string* whole) {
  if (!error_.ok() || !handed_off_.empty() || end_ > options_.part_size) {
    return false;
  }
  auto it = buffering_.find(0);
  if (it != buffering_.end()) *whole = std::move(it->second.data);
  whole->resize(end_, '\0');
  buffering_.clear();
  return true;
}

void ObjectWriter::FlushParts() {
  // Every part not handed off yet goes now, holes as zeros; the last one is
  // cut at the end of the object.
  const uint64_t ps = options_.part_size;
  const int parts = static_cast<int>((end_ + ps - 1) / ps);
  for (int i = 0; i < parts; ++i) {
    if (static_cast<size_t>(i) < handed_off_.size() && handed_off_[i]) {
      continue;
    }
    std::string bytes;
    auto it = buffering_.find(i);
    if (it != buffering_.end()) bytes = std::move(it->second.data);
    bytes.resize(std::min(ps, end_ - i * ps), '\0');
    Enqueue(i, std::move(bytes));
  }
  buffering_.clear();
  while (error_.ok() && in_flight_ > 0) changed_.Wait(&mu_);
}

absl::Status ObjectWriter::PutWholeObject(const std::string& whole) {
  PutOptions po;
  po.if_none_match = options_.if_none_match;
  absl::Status s = client_->PutObject(bucket_, key_, whole, po);
  MutexLock l(&mu_);
  if (!s.ok()) return error_ = s;
  committed_ = true;
  return s;
}

absl::Status ObjectWriter::CompleteUpload() {
  StopUploads();
  std::vector<CompletedPart> parts;
  std::string upload_id;
  absl::Status failed;
  {
    MutexLock l(&mu_);
    failed = error_;
    parts = completed_;
    upload_id = upload_id_;
  }
  if (!failed.ok()) {
    (void)Abort();
    return failed;
  }
  std::sort(parts.begin(), parts.end(),
            [](const CompletedPart& a, const CompletedPart& b) {
              return a.part_number < b.part_number;
            });
  PutOptions po;
  po.if_none_match = options_.if_none_match;
  absl::Status s =
      client_->CompleteMultipartUpload(bucket_, key_, upload_id, parts, po);
  if (!s.ok()) {
    (void)Fail(s);
    (void)Abort();
    return s;
  }
  MutexLock l(&mu_);
  committed_ = true;
  return s;
}

absl::Status ObjectWriter::Abort() {
  {
    MutexLock l(&mu_);
    closed_ = true;
    if (error_.ok()) error_ = absl::AbortedError(Where() + ": aborted");
  }
  StopUploads();
  std::string upload_id;
  {
    MutexLock l(&mu_);
    if (committed_) return absl::OkStatus();
    upload_id.swap(upload_id_);
    buffering_.clear();
    queue_.clear();
  }
  if (upload_id.empty()) return absl::OkStatus();
  return client_->AbortMultipartUpload(bucket_, key_, upload_id);
}

int ObjectWriter::parts_uploaded() const {
  MutexLock l(&mu_);
  return static_cast<int>(completed_.size());
}

uint64_t ObjectWriter::size() const {
  MutexLock l(&mu_);
  return end_;
}

}  // namespace ckpt::s3
