#pragma once

// The worker <-> agent protocol's codec: the one place its lines are written and parsed
// (proto/varuna/v1/worker.proto; Note [Worker protocol] in worker_protocol.cc).
//
// A line is one protobuf JSON object (field names as in the .proto) without its newline:
//   {"t": 1700000000.5, "ready": {"resumed_from": 0}}
//   {"t": 1700000001.2, "step": {"step": 1, "loss": 10.8, ...}}
//   {"generation": 2, "stop": {}}
// Event lines in the older flat form that user programs write ({"step": 7, "loss": 2.5},
// {"ready": true, "resumed_from": 3}, {"stopped": true, "saved_step": 7}, {"error": "..."})
// parse into the same messages. Every function is pure and thread-safe.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "varuna/v1/worker.pb.h"

namespace varuna {

// The environment variables the agent sets for every worker process.
inline constexpr char kProgressFileEnv[] = "VARUNA_PROGRESS_FILE";  // events, appended
// Commands: the read end of a pipe the agent made, inherited as file descriptor kControlFd
// (Note [Worker protocol] in worker_protocol.cc). A FIFO's path in kControlFifoEnv does the
// same for a worker started by hand or by a test.
inline constexpr char kControlFdEnv[] = "VARUNA_CONTROL_FD";
inline constexpr int kControlFd = 3;
inline constexpr char kControlFifoEnv[] = "VARUNA_CONTROL_FIFO";

// Byte budgets, newline excluded. An event line is bounded so that the agent's reads are; a
// command line fits one atomic write to a pipe (PIPE_BUF, 4096, with its newline).
inline constexpr size_t kMaxEventLineBytes = 64 << 10;
inline constexpr size_t kMaxCommandLineBytes = 4095;
inline constexpr size_t kMaxErrorBytes = 2000;       // WorkerError.message; longer is cut
inline constexpr size_t kMaxPathBytes = 4096;        // WorkerProfile.path
inline constexpr int kMaxStageValues = 4096;         // stage_busy_s / stage_wait_s; more: dropped
inline constexpr int kMaxRankValues = 1024;          // rank_busy_s / rank_wait_s; more: dropped
inline constexpr size_t kMaxReconfigureText = 2048;  // pipelines, master_addr

// Returns the line for `event` (no newline). Too-long error messages are cut and invalid
// UTF-8 is replaced, as ParseWorkerEvent would; an event that still breaks a rule (no kind,
// step < 1, a negative saved step, an empty or over-long profile path, a line over
// kMaxEventLineBytes) is an InvalidArgumentError. ParseWorkerEvent(*result) gives back the
// same event.
absl::StatusOr<std::string> SerializeWorkerEvent(const v1::WorkerEvent& event);

// Parses one line (a trailing "\r" or whitespace is allowed) in either form. Numbers may be
// NaN or infinite: "NaN"/"Infinity" strings, and in the flat form printf's bare nan/inf too.
// Fields of a wrong type in a flat step line are ignored (as they always were); a step's
// `at` defaults to the line's `t`. Errors (InvalidArgumentError) say what is wrong.
absl::StatusOr<v1::WorkerEvent> ParseWorkerEvent(absl::string_view line);

// The same for commands: the line fits kMaxCommandLineBytes, a kind is set, and a
// reconfigure names a valid topology, a rank inside it and a generation >= 1.
absl::StatusOr<std::string> SerializeAgentCommand(const v1::AgentCommand& command);
absl::StatusOr<v1::AgentCommand> ParseAgentCommand(absl::string_view line);

// The name of a command's kind ("stop", "checkpoint_now", "reconfigure"; "none").
const char* CommandKindName(const v1::AgentCommand& command);

// Where the agent writes the StandbyStart of the standby worker `pid` it started in `dir`
// (VARUNA_STANDBY_DIR): DIR/start/PID.json, in a directory only the agent's user may enter
// (Note [Standby workers] in worker/runtime/standby.cc).
inline constexpr char kStandbyDirEnv[] = "VARUNA_STANDBY_DIR";
std::string StandbyStartPath(const std::string& dir, int pid);

}  // namespace varuna
