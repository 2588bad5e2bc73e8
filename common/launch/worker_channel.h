#pragma once

// The worker's end of the worker <-> agent protocol (Note [Worker protocol] in
// worker_protocol.cc): events appended to the progress file, commands read from the agent's
// pipe (or a FIFO). Plain POSIX, so any training program can use it; varuna-worker does.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "varuna/v1/worker.pb.h"

namespace varuna {

// Appends `event` as one line to the file named by VARUNA_PROGRESS_FILE, stamping `t` with
// the current time when it is 0. Without the variable (a worker run by hand or by torchrun)
// does nothing and returns OK. One write(2) of the whole line on an O_APPEND file, never
// following a symlink. Thread-safe (any thread, also the rescue path before _Exit).
absl::Status AppendWorkerEvent(v1::WorkerEvent event);
// The same to an explicit file.
absl::Status AppendWorkerEventTo(const std::string& path, v1::WorkerEvent event);

// Reads AgentCommand lines from the agent's pipe (or a FIFO) on its own thread and hands each
// valid command to a handler. Empty lines are skipped; bad lines (too long, not a command,
// another generation's) are logged and skipped. Destroying it stops and joins the thread at
// once and closes what it read from.
class AgentCommandListener {
 public:
  // Called on the listener's thread, one command at a time; it must not block for long.
  using Handler = std::function<void(const v1::AgentCommand&)>;

  // Opens the FIFO at `path` (read-write and non-blocking: never waits for the agent, never
  // sees end-of-file) and starts the thread. Commands whose generation is neither 0 nor
  // `generation` are dropped (`generation` 0: any). Errors: `path` is missing or not a FIFO.
  static absl::StatusOr<std::unique_ptr<AgentCommandListener>> Start(const std::string& path,
                                                                     int generation,
                                                                     Handler handler);
  // Reads the pipe (or FIFO) open at `fd`, which it owns from now on (closed on error too, and
  // close-on-exec from now on). Errors: `fd` is not open or not a pipe.
  static absl::StatusOr<std::unique_ptr<AgentCommandListener>> Adopt(int fd, int generation,
                                                                     Handler handler);
  ~AgentCommandListener();
  AgentCommandListener(const AgentCommandListener&) = delete;
  AgentCommandListener& operator=(const AgentCommandListener&) = delete;

  // The generation this worker now belongs to (after a morph in place). Thread-safe.
  void set_generation(int generation) { generation_.store(generation); }
  // Valid commands handed to the handler so far. Thread-safe.
  int handled() const { return handled_.load(); }

 private:
  AgentCommandListener(int fifo_fd, int wake_read, int wake_write, int generation, Handler handler);
  void Run();
  void HandleLine(const std::string& line);

  const int fifo_fd_;
  const int wake_read_;  // the destructor writes to wake_write_ to end Run()
  const int wake_write_;
  std::atomic<int> generation_;
  const Handler handler_;
  std::atomic<int> handled_{0};
  std::thread thread_;
};

}  // namespace varuna
