#include "manager/api/manager_api.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "manager/jobs/log_proxy.h"

namespace varuna {

ManagerApi::ManagerApi(Manager* manager, AgentClientPool* agents)
    : manager_(manager), agents_(agents) {}

absl::StatusOr<v1::JobInfo> ManagerApi::Submit(const v1::SubmitRequest& req, JobSpec spec,
                                               const std::string& user, const std::string& run_as,
                                               uint32_t run_as_uid, bool admin) {
  const Manager::Parts p = manager_->parts();
  auto r = p.job_controller->Submit(req, std::move(spec), user, run_as, run_as_uid, admin);
  if (r.ok() && p.metrics != nullptr) p.metrics->AddJob(r->id());
  return r;
}

std::vector<v1::JobInfo> ManagerApi::ListJobs() const {
  const JobTable& jobs = *manager_->parts().jobs;
  std::vector<v1::JobInfo> out;
  for (const auto& id : jobs.order()) out.push_back(jobs.Find(id)->info());
  return out;
}

// Note [Pages]: every list a client can grow is paged, by count and by bytes, so no reply
// nears the 4 MiB message limit however many jobs (events: EventLog::List; step records:
// StepSeries::Get). A jobs page token is the seq of the page's last job; jobs pruned
// meanwhile (retention) simply drop out.
absl::StatusOr<v1::ListJobsResponse> ManagerApi::ListJobs(const v1::ListJobsRequest& req) const {
  constexpr size_t kMaxPageBytes = 2 << 20;
  const JobTable& jobs = *manager_->parts().jobs;
  const int size = req.page_size() > 0 ? std::min(req.page_size(), 1000) : 500;
  int64_t after = 0;
  if (!req.page_token().empty() && (!absl::SimpleAtoi(req.page_token(), &after) || after < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("list jobs: page_token '", req.page_token(), "' is not from a previous page"));
  }
  v1::ListJobsResponse resp;
  size_t bytes = 0;
  int64_t last = 0;
  for (const auto& id : jobs.order()) {
    const Job& job = *jobs.Find(id);
    if (job.rec.seq() <= after) continue;
    const size_t b = job.info().ByteSizeLong();
    if (resp.jobs_size() >= size || (resp.jobs_size() > 0 && bytes + b > kMaxPageBytes)) {
      resp.set_next_page_token(absl::StrCat(last));
      break;
    }
    bytes += b;
    last = job.rec.seq();
    *resp.add_jobs() = job.info();
  }
  return resp;
}

absl::StatusOr<v1::JobInfo> ManagerApi::GetJob(const std::string& id) const {
  const Job* job = manager_->parts().jobs->Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id '", id, "'"));
  return job->info();
}

absl::StatusOr<v1::JobInfo> ManagerApi::Cancel(const std::string& id, const std::string& user) {
  return manager_->parts().job_controller->Cancel(id, user);
}

void ManagerApi::GetLogs(const v1::GetLogsRequest& req,
                         std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done) {
  const Manager::Parts p = manager_->parts();
  const Job* job = p.jobs->Find(req.job_id());
  if (job == nullptr) {
    done(absl::NotFoundError(absl::StrCat("no job with id '", req.job_id(), "'")));
    return;
  }
  ProxyLogs(*job, *p.nodes, agents_, req, std::move(done));
}

v1::NodeInfo ManagerApi::Describe(const NodeTable::Node& n) const {
  const Manager::Parts p = manager_->parts();
  const auto used = p.jobs->UsedSlots();
  auto it = used.find(n.rec.name());
  std::vector<v1::NodeInfo> info{p.nodes->Describe(n, it == used.end() ? 0 : it->second)};
  p.stragglers->Annotate(&info);
  return info[0];
}

std::vector<v1::NodeInfo> ManagerApi::ListNodes() const {
  const Manager::Parts p = manager_->parts();
  const auto used = p.jobs->UsedSlots();  // once, not per node: 1,000 nodes made this quadratic
  std::vector<v1::NodeInfo> out;
  out.reserve(p.nodes->all().size());
  for (const auto& [name, n] : p.nodes->all()) {
    auto it = used.find(name);
    out.push_back(p.nodes->Describe(n, it == used.end() ? 0 : it->second));
    if (p.slurm) out.back().set_source(p.slurm->SourceOf(name));
  }
  p.stragglers->Annotate(&out);
  return out;
}

std::vector<v1::MachineSource> ManagerApi::ListSources() const {
  const SlurmSource* slurm = manager_->parts().slurm;
  std::vector<v1::MachineSource> out;
  if (slurm) out.push_back(slurm->Status());
  return out;
}

absl::StatusOr<v1::NodeInfo> ManagerApi::Drain(const std::string& name, bool undo) {
  ASSIGN_OR_RETURN(NodeTable::Node * n, manager_->parts().nodes->Drain(name, undo));
  return Describe(*n);
}

absl::StatusOr<v1::NodeInfo> ManagerApi::Preempt(const std::string& name,
                                                 const v1::PreemptionNotice& notice) {
  ASSIGN_OR_RETURN(NodeTable::Node * n, manager_->parts().nodes->Preempt(name, notice));
  return Describe(*n);
}

v1::ListEventsResponse ManagerApi::ListEvents(const v1::ListEventsRequest& req) const {
  return manager_->parts().events->List(req);
}

absl::StatusOr<v1::GetMetricsResponse> ManagerApi::GetMetrics(
    const v1::GetMetricsRequest& req) const {
  const Manager::Parts p = manager_->parts();
  if (p.jobs->Find(req.job_id()) == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job with id '", req.job_id(), "'"));
  }
  return p.steps->Get(req);
}

PlanInputs ManagerApi::PlanInputsFor(const JobSpec& spec) const {
  const Manager::Parts p = manager_->parts();
  return ::varuna::PlanInputsFor(spec, *p.nodes, *p.profiles);
}

v1::GetProfileResponse ManagerApi::GetProfile(const v1::GetProfileRequest& req) const {
  return manager_->parts().profiles->Get(req);
}

absl::StatusOr<v1::GetStagesResponse> ManagerApi::GetStages(const std::string& id) const {
  const Manager::Parts p = manager_->parts();
  const Job* job = p.jobs->Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id '", id, "'"));
  ASSIGN_OR_RETURN(v1::GetStagesResponse resp,
                   DescribeStages(*job, p.profiles->Find(job->spec), p.steps->Newest(id)));
  p.stragglers->Annotate(id, &resp);
  return resp;
}

}  // namespace varuna
