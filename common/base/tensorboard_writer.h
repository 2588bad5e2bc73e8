#pragma once

// TensorBoard event files written without TensorFlow: TFRecord framing (length, masked CRC-32C,
// payload, masked CRC-32C) around tensorflow.Event messages encoded by hand (Note [Event
// files] in tensorboard_writer.cc). Scalars are Summary simple values; text is the text
// plugin's string tensor.
//
//   ASSIGN_OR_RETURN(auto tb, TensorBoardWriter::Open("/runs/job-7", /*first_step=*/1));
//   RETURN_IF_ERROR(tb->Scalar("train/loss", step, loss));
//   RETURN_IF_ERROR(tb->Flush());

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varuna {

// CRC-32C (Castagnoli) of `data`, and TFRecord's masked form of it.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskedCrc32c(absl::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it whose first events are the
  // file version and a session start at `first_step`: TensorBoard's reader drops what older
  // files hold at or after that step (a resumed or regrouped run redoes those steps).
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir,
                                                                 int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // A session start at `step`: TensorBoard drops what came before at steps >= it (a run that
  // goes on in this file after a rewind: a morph that resumed from an older step).
  absl::Status SessionStart(int64_t step);
  absl::Status Scalar(absl::string_view tag, int64_t step, double value);
  absl::Status Text(absl::string_view tag, int64_t step, absl::string_view text);
  // Writes what is buffered to the file (TensorBoard reads it while the run goes on).
  absl::Status Flush();
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteEvent(const std::string& event);

  const std::string path_;
  FILE* file_;
};

}  // namespace varuna
