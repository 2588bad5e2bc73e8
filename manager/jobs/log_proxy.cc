#include "manager/jobs/log_proxy.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace varuna {

void ProxyLogs(const Job& job, const NodeTable& nodes, AgentClientPool* agents,
               const v1::GetLogsRequest& req,
               std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done) {
  std::string node_name;
  for (const auto& p : job.info().placement()) {
    if (p.rank() == req.rank()) node_name = p.node();
  }
  if (node_name.empty()) {
    if (job.info().placement_size() == 0) {
      done(absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " is ",
                                                      v1::JobState_Name(job.info().state()),
                                                      " and has never run: no logs")));
    } else {
      done(absl::NotFoundError(absl::StrCat("job ", req.job_id(), " has no rank ", req.rank(),
                                            " (ranks 0..", job.info().placement_size() - 1, ")")));
    }
    return;
  }
  const NodeTable::Node* nit = nodes.Find(node_name);
  if (nit == nullptr) {
    done(absl::UnavailableError(absl::StrCat("node ", node_name, " is unknown")));
    return;
  }
  v1::FetchLogsRequest fetch;
  fetch.set_job_id(req.job_id());
  fetch.set_rank(req.rank());
  fetch.set_offset(req.offset());
  fetch.set_max_bytes(req.max_bytes());
  const bool finished = Terminal(job.info().state());
  agents->For(nit->rec.name(), nit->rec.address())
      ->FetchLogs(fetch, [done = std::move(done), node_name,
                          finished](absl::StatusOr<v1::FetchLogsResponse> r) {
        if (!r.ok()) {
          done(absl::Status(r.status().code(), absl::StrCat("logs from node ", node_name, ": ",
                                                            r.status().message())));
          return;
        }
        v1::GetLogsResponse resp;
        resp.set_data(r->data());
        resp.set_next_offset(r->next_offset());
        resp.set_node(node_name);
        resp.set_job_finished(finished);
        done(std::move(resp));
      });
}

}  // namespace varuna
