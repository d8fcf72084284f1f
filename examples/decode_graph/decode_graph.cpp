// decode_graph: an inference engine's decode step captured once as a graph and
// replayed per token. The step's scratch buffer is allocated and freed inside
// the capture, so it lives in the graph's private pool: no other allocation
// gets its bytes while the graph can be replayed, and each replay finds it
// where the capture recorded it. The step's update is the program's own kernel
// (accumulate: a real CUDA kernel on a device, its host reference on the sim).
// The graph holds device work only, so where the device makes native graphs
// (cuda) each token's replay is one cudaGraphLaunch; the state is read back
// outside it. Every token's state is checked against a host reference.
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "../example_args.hpp"
#include "../own_kernel/accumulate.hpp"
#include "../own_kernel/accumulate_op.hpp"
#include "ferry/content.hpp"
#include "ferry/graph.hpp"
#include "ferry/runtime.hpp"

namespace {

constexpr std::uint64_t kHidden = 64 << 10;  // bytes of the recurrent state
constexpr int kTokens = 32;
constexpr ferry::StreamId kDecode = 1;

std::vector<std::byte> pattern(std::uint64_t seed) {
  std::vector<std::byte> v(kHidden);
  ferry::fill_pattern(seed, 0, v);
  return v;
}

// What ferry's compute op writes: a pattern seeded by every input's content.
std::vector<std::byte> mix(const std::vector<const std::vector<std::byte>*>& inputs) {
  std::uint64_t acc = ferry::kMixStart;
  for (std::size_t k = 0; k < inputs.size(); ++k) acc = ferry::mix_step(acc, k, ferry::content_hash(*inputs[k]));
  return pattern(acc);
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BackendSpec spec;
  if (int exit = example::parse_args(argc, argv, "decode_graph: a decode step captured once, replayed per token",
                                     &spec);
      exit >= 0) {
    return exit;
  }
  ferry::RuntimeOptions options;
  options.backend = spec;
  options.backend.profile = "tiny";
  auto runtime = ferry::Runtime::create(options);
  if (!runtime.ok()) return example::fail(runtime.error());
  ferry::Runtime& rt = **runtime;
  const std::shared_ptr<ferry::PoolCalls> calls = rt.calls();

  // The model's weights, the token's input and the recurrent state: the program's.
  auto weights = calls->allocate(kHidden, kDecode, "weights");
  auto token = calls->allocate(kHidden, kDecode, "token");
  auto state = calls->allocate(kHidden, kDecode, "state");
  for (const auto* h : {&weights, &token, &state}) {
    if (!h->ok()) return example::fail(h->error());
  }
  if (auto r = calls->fill(kDecode, *weights, 1); !r.ok()) return example::fail(r.error());
  if (auto r = calls->fill(kDecode, *state, 2); !r.ok()) return example::fail(r.error());
  std::vector<std::byte> logits(kHidden);

  // The decode step, captured once.
  if (auto r = rt.begin_capture(kDecode); !r.ok()) return example::fail(r.error());
  auto scratch = rt.calls()->allocate(kHidden, kDecode, "scratch");  // the graph's own
  if (!scratch.ok()) return example::fail(scratch.error());
  const ferry::DeviceHandle projection_in[] = {*weights, *token};
  const ferry::Operand update[] = {{*state, ferry::Access::read_write}, {*scratch, ferry::Access::read}};
  for (auto r : {calls->compute(kDecode, projection_in, *scratch),
                 calls->user(kDecode, update, accumulate_op, {}, "update")}) {
    if (!r.ok()) return example::fail(r.error());
  }
  if (auto r = calls->free(*scratch); !r.ok()) return example::fail(r.error());
  auto graph = rt.end_capture(kDecode);
  if (!graph.ok()) return example::fail(graph.error());

  // Replayed per token; the host keeps the reference.
  const std::vector<std::byte> w = pattern(1);
  std::vector<std::byte> want = pattern(2);
  int right = 0;
  for (int t = 0; t < kTokens; ++t) {
    if (auto r = calls->fill(kDecode, *token, 1000 + t); !r.ok()) return example::fail(r.error());
    if (auto r = rt.launch(*graph, kDecode); !r.ok()) return example::fail(r.error());
    if (auto r = calls->copy_to_host(kDecode, *state, logits); !r.ok()) return example::fail(r.error());
    if (auto r = calls->synchronize(kDecode); !r.ok()) return example::fail(r.error());
    const std::vector<std::byte> x = pattern(1000 + t);
    host_accumulate(want, mix({&w, &x}));
    right += logits == want ? 1 : 0;
  }
  const ferry::GraphStats gs = graph->stats();
  const ferry::GraphPoolStats ps = graph->pool().stats();
  std::printf("decode_graph on %s: %llu ops captured once, replayed for %d tokens (%s); graph pool: %llu block(s), "
              "%llu bytes reserved; %d of %d tokens right\n",
              std::string(ferry::to_string(spec.kind)).c_str(), static_cast<unsigned long long>(gs.ops),
              static_cast<int>(gs.launches),
              gs.native ? "each replay one native graph launch" : ("op by op: " + gs.per_op_reason).c_str(),
              static_cast<unsigned long long>(ps.blocks),
              static_cast<unsigned long long>(ps.reserved_bytes), right, kTokens);
  if (auto r = graph->destroy(); !r.ok()) return example::fail(r.error());
  for (const auto* h : {&weights, &token, &state}) (void)calls->free(**h);
  return right == kTokens && example::race_free(rt.backend()) ? 0 : 1;
}
