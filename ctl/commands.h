#pragma once

// varunactl's commands, one constructor each (the table is assembled in varunactl.cc), by
// group and file: Jobs (commands_jobs.cc), Monitoring (commands_monitoring.cc), Cluster
// (commands_cluster.cc), Planning (commands_planning.cc, commands_data.cc).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ctl/command_table.h"
#include "varuna/v1/control.pb.h"

namespace varuna::ctl {

inline constexpr char kGroupJobs[] = "Jobs";
inline constexpr char kGroupMonitoring[] = "Monitoring";
inline constexpr char kGroupCluster[] = "Cluster";
inline constexpr char kGroupPlanning[] = "Planning";
inline constexpr char kGroupOther[] = "Other";

Command NewCmdSubmit();
Command NewCmdList();
Command NewCmdQueue();
Command NewCmdStatus();
Command NewCmdCancel();

Command NewCmdLogs();
Command NewCmdEvents();
Command NewCmdMetrics();

Command NewCmdNodes();
Command NewCmdDrain();
Command NewCmdPreempt();
Command NewCmdManagers();

Command NewCmdPlan();
Command NewCmdProfile();
Command NewCmdData();  // commands_data.cc

inline bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

// Prints the jobs' state changes and progress until every one ends (to stderr with -o json,
// which then prints the final JobInfo(s) on stdout). Returns kExitOk if all succeeded, else
// kExitFailed. Keeps trying for about a minute while the manager is unreachable.
absl::StatusOr<int> FollowJobs(Session& session, const std::vector<std::string>& ids);

}  // namespace varuna::ctl
