// A test double over any backend (forwarding_backend.hpp) that answers
// Backend::connect_peer as a device's driver would, from the test's own rule, and
// records every question: so a test on the sim shows that a Runtime takes each
// pair's link from its backends (Runtime::link_between) rather than from
// DevicesOptions::links when the backends answer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ferry/forwarding_backend.hpp"
#include "ferry/runtime.hpp"

namespace ferry::testing {

struct LinkAnswers {
  // The answer for device `reader` about to copy from device `owner`.
  std::function<Result<std::optional<PeerLink>>(std::uint32_t reader, std::uint32_t owner)> answer;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> asked;  // (reader, owner), in call order
};

class LinkReportingBackend final : public ForwardingBackend {
 public:
  LinkReportingBackend(Backend& inner, std::uint32_t index, std::shared_ptr<LinkAnswers> answers)
      : ForwardingBackend(inner), index_(index), answers_(std::move(answers)) {}

  Result<std::optional<PeerLink>> connect_peer(Backend& peer) override {
    auto* owner = dynamic_cast<LinkReportingBackend*>(&peer);
    if (owner == nullptr) return make_error(ErrorCode::invalid_argument, "the peer is not a LinkReportingBackend");
    answers_->asked.emplace_back(index_, owner->index_);
    return answers_->answer(index_, owner->index_);
  }

 private:
  std::uint32_t index_;
  std::shared_ptr<LinkAnswers> answers_;
};

// Wraps each device `o` builds (in device order, so the adaptors know their
// device) in a LinkReportingBackend answering by `answer`.
inline std::shared_ptr<LinkAnswers> report_links(
    RuntimeOptions& o, std::function<Result<std::optional<PeerLink>>(std::uint32_t, std::uint32_t)> answer) {
  auto answers = std::make_shared<LinkAnswers>();
  answers->answer = std::move(answer);
  auto next = std::make_shared<std::uint32_t>(0);
  o.backend_adaptor = [answers, next](Backend& made) -> Result<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(std::make_unique<LinkReportingBackend>(made, (*next)++, answers));
  };
  return answers;
}

}  // namespace ferry::testing
