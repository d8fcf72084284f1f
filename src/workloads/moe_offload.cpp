// moe-offload (report 000): MoE layers whose experts sit in host banks, with a
// device expert cache, a skewed routing trace, prefetch of predicted experts, and
// optionally host execution of misses.
//
// Routing trace (seeded, fixed before the run): each layer ranks its experts by
// a seeded permutation; every token picks top-k distinct experts with Zipf
// weights 1/(rank+1)^1.1. A pre-gate predicts the next layer's experts (the
// Pre-gated MoE idea): each true pick is predicted with probability 0.8, else a
// Zipf draw stands in. Its union is the prefetch hint.
//
// Per step (B tokens) and layer:
//   acquire every selected expert (pinned; a miss is fetched on the upload stream)
//   prefetch the experts predicted for the next layer (prefetch stream)
//   y_e = expert_e(x)          per selected expert: gu = x . Wgu [B, 2I],
//                              act = silu(gate) * up [B, I], y_e = act . Wdown [B, H]
//   x'  = combine(x, y_e...)   [B, H]
// and per step digest' = mix(digest, x_final).
// Host execution (--host-exec): a selected expert that is not resident or in
// flight is not fetched; x is copied to the host (on its own stream, while the
// device runs the hits), the host computes y_e with the same definitions
// (charged on the virtual clock with the host model of WorkloadOptions) and
// uploads it; the missed expert is handed to the cache as a prefetch, so it is
// admitted in the background for later steps.
//
// Several devices (docs/workloads.md): one MultiDeviceCache over them places
// expert e of layer l on device (16 l + e) mod N (round_robin over the keys,
// defined in key order). A layer's experts run where they are placed, except
// that a device given more than its share (ceil(picks / N)) hands the rest to
// the device with the fewest so far (expert load balancing, fixed by the
// routing trace before the run); that device acquires the expert there, so the
// cache fills its slot from the device that holds it over their link, or from
// the host, whichever the cost model says is faster.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "core/align.hpp"
#include "workloads/exec.hpp"

#include "ferry/cost_model.hpp"
#include "ferry/multi_device_cache.hpp"

namespace ferry::workloads {
namespace {

constexpr std::uint64_t kLayers = 4;
constexpr std::uint64_t kExperts = 16;
constexpr std::uint64_t kTopK = 4;
constexpr std::uint64_t kTokensPerStep = 4;
constexpr std::uint64_t kSteps = 64;
constexpr double kZipf = 1.1;
constexpr double kPredictAccuracy = 0.8;
constexpr std::uint32_t kDefaultSlots = 32;

// A counter-based generator: same seed, same trace on every platform.
class Draws {
 public:
  explicit Draws(std::uint64_t seed) : state_(splitmix64(seed ^ 0x5bd1e9955bd1e995ull)) {}
  std::uint64_t next() { return splitmix64(state_++); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

struct Pick {
  std::uint64_t expert = 0;
  std::uint64_t tokens = 0;  // tokens of the step routed to it
};

class MoeOffload final : public Workload {
 public:
  MoeOffload(const WorkloadOptions& options, double s) : options_(options) {
    hidden_ = scaled(1024, s);
    inter_ = scaled(512, s);
    make_trace();
    assign_devices();
  }

  std::string shape() const override {
    return std::to_string(kLayers) + " layers x " + std::to_string(kExperts) + " experts, hidden " +
           std::to_string(hidden_) + ", intermediate " + std::to_string(inter_) + ", top-" +
           std::to_string(kTopK) + ", " + std::to_string(kTokensPerStep) + " tokens x " +
           std::to_string(kSteps) + " steps, bf16";
  }

  std::vector<SyntheticTensor> tensors() const override {
    std::vector<SyntheticTensor> out;
    for (std::uint64_t l = 0; l < kLayers; ++l) {
      for (std::uint64_t e = 0; e < kExperts; ++e) {
        const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e);
        out.push_back(tensor(p + ".gate_up_proj.weight", {2 * inter_, hidden_}));
        out.push_back(tensor(p + ".down_proj.weight", {hidden_, inter_}));
      }
    }
    return out;
  }

  Result<void> check_options() const override {
    // A layer pins every expert it runs on a device at once: fewer slots there can never serve it.
    for (std::uint32_t d = 0; d < devices(); ++d) {
      std::size_t need = 1, step = 0, layer = 0;
      for (std::uint64_t t = 0; t < kSteps; ++t) {
        for (std::uint64_t l = 0; l < kLayers; ++l) {
          const std::vector<std::uint32_t>& on = assigned_[t][l];
          const auto here = static_cast<std::size_t>(std::count(on.begin(), on.end(), d));
          if (here > need) std::tie(need, step, layer) = std::tuple(here, t, l);
        }
      }
      if (slots_per_device() >= need) continue;
      const std::string where = options_.devices > 1 ? " on device " + std::to_string(d) : "";
      const std::uint64_t total = static_cast<std::uint64_t>(need) * options_.devices;
      return make_error(ErrorCode::invalid_argument,
                        "--slots " + std::to_string(total_slots()) + ": step " + std::to_string(step + 1) +
                            " routes layer " + std::to_string(layer) + "'s tokens to " + std::to_string(need) +
                            " experts" + where + ", all pinned at once; with seed " + std::to_string(options_.seed) +
                            " moe-offload needs --slots " + std::to_string(options_.devices > 1 ? total : need) +
                            " or more" + (options_.devices > 1 ? " (split evenly over the devices)" : ""));
    }
    return {};
  }

  // The cache fetches an expert whenever it misses, from bytes it holds for the whole run.
  bool stages_weights() const override { return false; }

  Result<void> bind(const WeightBank& bank) override {
    Result<std::vector<std::size_t>> index = resolve_tensors(bank, tensors());
    if (!index.ok()) return std::move(index).error();
    // A synthetic bank is small_bf16 by construction; a file must be checked.
    if (uses_gemm(options_) && !options_.weights_path.empty()) FERRY_TRY(check_gemm_weights(bank, *index));
    index_ = std::move(index).value();
    return {};
  }

  std::uint64_t reference(Reference& ref, const WeightBank& bank) override {
    const std::uint64_t xb = kTokensPerStep * hidden_ * 2;
    HostValue digest = ref.fill(digest_seed(), kDigestBytes);
    std::uint64_t seed = digest_seed();
    for (std::uint64_t t = 0; t < kSteps; ++t) {
      HostValue x = ref.fill(step_seed(t), xb);
      for (std::uint64_t l = 0; l < kLayers; ++l) {
        std::vector<HostValue> combine{x};
        for (const Pick& p : selected_[t][l]) combine.push_back(expert(ref, bank, l * kExperts + p.expert, x));
        x = ref.kernel(combine, xb);
      }
      seed = Reference::mix({digest, x});
      digest = ref.fill(seed, kDigestBytes);
    }
    return seed;  // the last digest kernel's: its output is fill_with(kPattern, seed)
  }

  Result<std::vector<std::byte>> execute(Exec& ex, const WeightBank& bank) override {
    cache_slots = total_slots();
    const std::uint64_t gu_bytes = 2 * inter_ * hidden_ * 2, down_bytes = hidden_ * inter_ * 2;
    const std::uint64_t entry_bytes = detail::align_up(gu_bytes, detail::kBlockAlign) + down_bytes;
    const std::uint32_t n = ex.device_count();
    // One expert cache over the devices, `slots_per_device()` slots on each.
    std::unique_ptr<MultiDeviceCache> cache;
    if (ex.dry()) {
      for (std::uint32_t d = 0; d < n; ++d) ex.on(d), ex.dry_hold(std::uint64_t{slots_per_device()} * entry_bytes);
    } else {
      MultiDeviceCacheOptions mo;
      mo.cache.slots = slots_per_device();
      mo.cache.policy = options_.policy;
      mo.cache.upload_stream = kUpload;
      mo.cache.prefetch_stream = kUpload;  // one host link: prefetches queue with demand fetches
      mo.placement = DevicePlacement::round_robin;
      Result<std::unique_ptr<MultiDeviceCache>> made = MultiDeviceCache::create(*ex.env().runtime, mo);
      if (!made.ok()) return std::move(made).error();
      cache = std::move(made).value();
      // Defined in key order: round_robin places key k on device k mod N (home()).
      for (CacheKey key = 0; key < kLayers * kExperts; ++key) {
        FERRY_TRY(cache->define(key, {bank.bytes(index_[2 * key]), bank.bytes(index_[2 * key + 1])}));
      }
      if (options_.policy == EvictionPolicy::optimal) {
        for (std::uint32_t d = 0; d < n; ++d) cache->device_cache(d).set_access_plan(access_plan(d));
      }
    }
    ex.on(0);
    device_units.assign(n, 0);
    device_tokens.assign(n, 0);
    Result<std::vector<std::byte>> out = run(ex, bank, cache.get());
    if (cache) {
      const MultiDeviceCacheStats ms = cache->stats();
      CacheStats total;
      device_cache_stats.clear();
      device_cache_slots.clear();
      for (std::uint32_t d = 0; d < n; ++d) {
        add(total, ms.devices[d]);
        if (n > 1) device_cache_stats.push_back(ms.devices[d]), device_cache_slots.push_back(slots_per_device());
      }
      cache_stats = total;
    }
    return out;
  }

  std::uint64_t nominal_tokens() const override { return kTokensPerStep * kSteps; }
  std::uint64_t units() const override { return kSteps; }
  std::string unit_name() const override { return "steps"; }
  std::string device_unit_name() const override { return "expert runs"; }
  // A token routed to top-k experts in each layer is counted at each one.
  std::string device_tokens_unit() const override { return "token-expert passes"; }

 private:
  SyntheticTensor tensor(std::string name, std::vector<std::uint64_t> shape) const {
    const std::uint64_t seed = splitmix64(options_.seed ^ fnv1a(name));
    return SyntheticTensor{std::move(name), DType::bf16, std::move(shape), seed, kPattern};
  }
  std::uint64_t step_seed(std::uint64_t t) const {
    return splitmix64(options_.seed ^ fnv1a("moe-offload.input") ^ (t * 0x9e3779b97f4a7c15ull));
  }
  std::uint64_t digest_seed() const { return splitmix64(options_.seed ^ fnv1a("moe-offload.digest")); }

  void make_trace() {
    Draws d(options_.seed);
    std::vector<double> cdf(kExperts);
    double sum = 0;
    for (std::uint64_t r = 0; r < kExperts; ++r) cdf[r] = sum += 1.0 / std::pow(double(r + 1), kZipf);
    std::vector<std::vector<std::uint64_t>> rank_to_expert(kLayers);
    for (auto& perm : rank_to_expert) {
      perm.resize(kExperts);
      for (std::uint64_t e = 0; e < kExperts; ++e) perm[e] = e;
      for (std::uint64_t i = kExperts - 1; i > 0; --i) std::swap(perm[i], perm[d.next() % (i + 1)]);
    }
    const auto zipf = [&](std::uint64_t l) {
      const double u = d.unit() * sum;
      const auto r = static_cast<std::uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      return rank_to_expert[l][std::min(r, kExperts - 1)];
    };
    selected_.assign(kSteps, std::vector<std::vector<Pick>>(kLayers));
    predicted_.assign(kSteps, std::vector<std::vector<std::uint64_t>>(kLayers));
    for (std::uint64_t t = 0; t < kSteps; ++t) {
      for (std::uint64_t l = 0; l < kLayers; ++l) {
        std::map<std::uint64_t, std::uint64_t> tokens;
        std::set<std::uint64_t> guess;
        for (std::uint64_t b = 0; b < kTokensPerStep; ++b) {
          std::set<std::uint64_t> picks;
          while (picks.size() < kTopK) picks.insert(zipf(l));
          for (std::uint64_t e : picks) {
            ++tokens[e];
            guess.insert(d.unit() < kPredictAccuracy ? e : zipf(l));
          }
        }
        for (const auto& [e, n] : tokens) selected_[t][l].push_back({e, n});
        predicted_[t][l].assign(guess.begin(), guess.end());
      }
    }
  }

  // The device the cache places `key` on (MultiDeviceCache's round_robin: its
  // definition index, which is the key, modulo the device count).
  std::uint32_t home(CacheKey key) const { return static_cast<std::uint32_t>(key % devices()); }
  // The device count; a count run_workload refuses (0, too many) plans as the nearest it takes.
  std::uint32_t devices() const { return std::clamp<std::uint32_t>(options_.devices, 1, kMaxWorkloadDevices); }
  std::uint32_t total_slots() const { return options_.cache_slots != 0 ? options_.cache_slots : kDefaultSlots; }
  // Every device's cache has as many slots (multi_device_cache.hpp): the total split evenly.
  std::uint32_t slots_per_device() const { return total_slots() / devices(); }

  // Where each pick runs: at its expert's home, unless the home already runs its
  // share of the layer (ceil(picks / N)); then on the device running fewest
  // (the lowest on a tie). Same trace, same assignment: the dry run plans it.
  void assign_devices() {
    const std::uint32_t n = devices();
    assigned_.assign(kSteps, std::vector<std::vector<std::uint32_t>>(kLayers));
    for (std::uint64_t t = 0; t < kSteps; ++t) {
      for (std::uint64_t l = 0; l < kLayers; ++l) {
        const std::vector<Pick>& sel = selected_[t][l];
        const std::size_t share = (sel.size() + n - 1) / n;
        std::vector<std::size_t> count(n);
        for (const Pick& p : sel) {
          std::uint32_t d = home(l * kExperts + p.expert);
          if (count[d] >= share) {
            d = static_cast<std::uint32_t>(std::min_element(count.begin(), count.end()) - count.begin());
          }
          ++count[d];
          assigned_[t][l].push_back(d);
        }
      }
    }
  }
  static void add(CacheStats& t, const CacheStats& c) {
    t.hits += c.hits, t.misses += c.misses, t.prefetches += c.prefetches, t.prefetch_hits += c.prefetch_hits;
    t.prefetch_wasted += c.prefetch_wasted, t.prefetch_dropped += c.prefetch_dropped, t.evictions += c.evictions;
    t.uploads += c.uploads, t.bytes_uploaded += c.bytes_uploaded, t.waited_uploads += c.waited_uploads;
    t.fills += c.fills, t.bytes_filled += c.bytes_filled;
  }

  // The acquires of device `device`'s cache, in order.
  std::vector<CacheKey> access_plan(std::uint32_t device) const {
    std::vector<CacheKey> plan;
    for (std::uint64_t t = 0; t < kSteps; ++t)
      for (std::uint64_t l = 0; l < kLayers; ++l)
        for (std::size_t i = 0; i < selected_[t][l].size(); ++i)
          if (assigned_[t][l][i] == device) plan.push_back(l * kExperts + selected_[t][l][i].expert);
    return plan;
  }

  double expert_flops(std::uint64_t tokens) const {
    return 2.0 * static_cast<double>(tokens) * 3.0 * static_cast<double>(hidden_) * static_cast<double>(inter_);
  }
  // [m, k] activations times a [n, k] weight, transposed.
  static GemmShape linear(std::uint64_t m, std::uint64_t n, std::uint64_t k) {
    return {static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(k), false, true};
  }
  GemmShape gate_up_shape() const { return linear(kTokensPerStep, 2 * inter_, hidden_); }
  GemmShape down_shape() const { return linear(kTokensPerStep, hidden_, inter_); }

  // Expert `key` on x, as the device computes it: gu = x . Wgu, act = silu(gate) * up, y = act . Wdown.
  HostValue expert(Reference& ref, const WeightBank& bank, std::uint64_t key, const HostValue& x) const {
    const auto w = [&](std::size_t t) { return ref.weight(bank, t); };
    const HostValue gu = ref.matmul(x, w(index_[2 * key]), gate_up_shape());
    const HostValue act = ref.kernel({gu}, kTokensPerStep * inter_ * 2);
    return ref.matmul(act, w(index_[2 * key + 1]), down_shape());
  }

  Result<std::vector<std::byte>> run(Exec& ex, const WeightBank& bank, MultiDeviceCache* cache) {
    const std::uint64_t xb = kTokensPerStep * hidden_ * 2;
    const std::uint32_t n = ex.device_count();
    Result<DeviceHandle> d0 = ex.alloc(kDigestBytes, kCompute);
    if (!d0.ok()) return std::move(d0).error();
    DeviceHandle digest = *d0;
    FERRY_TRY(ex.fill(kCompute, digest, digest_seed()));
    for (std::uint64_t t = 0; t < kSteps; ++t) {
      Result<DeviceHandle> x0 = ex.alloc(xb, kCompute);
      if (!x0.ok()) return std::move(x0).error();
      DeviceHandle x = *x0;
      Result<StreamPoint> filled = ex.fill(kCompute, x, step_seed(t));
      if (!filled.ok()) return std::move(filled).error();
      StreamPoint x_ready = *filled;
      for (std::uint64_t l = 0; l < kLayers; ++l) {
        const std::vector<Pick>& sel = selected_[t][l];
        const std::vector<std::uint32_t>& on = assigned_[t][l];
        std::vector<DeviceHandle> ys(sel.size());
        // Device 0 holds x and combines; the others get a copy of x and run their
        // experts first, so that their work overlaps device 0's.
        for (std::uint32_t d = n; d-- > 0;) {
          ex.on(d);
          if (d == 0) {
            FERRY_TRY(layer_on(ex, bank, cache, t, l, x, x_ready, ys));
            continue;
          }
          if (std::find(on.begin(), on.end(), d) == on.end()) {  // no expert of this layer here: hints only
            FERRY_TRY(layer_on(ex, bank, cache, t, l, DeviceHandle{}, StreamPoint{}, ys));
            continue;
          }
          Result<Exec::Moved> xd = ex.copy_to(d, x, kCompute);
          if (!xd.ok()) return std::move(xd).error();
          FERRY_TRY(layer_on(ex, bank, cache, t, l, xd->handle, xd->done, ys));
          FERRY_TRY(ex.free(xd->handle));
        }
        // The other devices' outputs come to device 0 for the combine.
        for (std::size_t i = 0; i < sel.size(); ++i) {
          if (on[i] == 0) continue;
          Result<Exec::Moved> y = ex.copy_to(0, ys[i], kCompute);
          if (!y.ok()) return std::move(y).error();
          FERRY_TRY(ex.free(ys[i]));
          ys[i] = y->handle;
        }
        // Combine.
        Result<DeviceHandle> next = ex.alloc(xb, kCompute);
        if (!next.ok()) return std::move(next).error();
        std::vector<DeviceSlice> in{{x}};
        for (DeviceHandle y : ys) in.push_back({y});
        Result<StreamPoint> done = ex.kernel(kCompute, in, *next, 0, (sel.size() + 2) * xb);
        if (!done.ok()) return std::move(done).error();
        x_ready = *done;
        for (DeviceHandle y : ys) FERRY_TRY(ex.free(y));
        FERRY_TRY(ex.free(x));
        x = *next;
      }
      Result<DeviceHandle> d = ex.alloc(kDigestBytes, kCompute);
      if (!d.ok()) return std::move(d).error();
      FERRY_TRY(ex.kernel(kCompute, {{digest}, {x}}, *d, 0, 2 * kDigestBytes + xb));
      FERRY_TRY(ex.free(digest));
      FERRY_TRY(ex.free(x));
      digest = *d;
      ex.progress("steps", t + 1, kSteps);
    }
    Result<std::vector<std::byte>> bytes = ex.download(kCompute, digest);
    FERRY_TRY(ex.free(digest));
    return bytes;
  }

  // Layer l of step t on the current device, for the experts assigned to it:
  // acquire them (or find the misses), hint the next layer's experts placed
  // here, run the resident ones on x (ready at x_ready) and the misses on the
  // host (--host-exec); each output into ys[i] on this device.
  Result<void> layer_on(Exec& ex, const WeightBank& bank, MultiDeviceCache* cache, std::uint64_t t, std::uint64_t l,
                        DeviceHandle x, StreamPoint x_ready, std::vector<DeviceHandle>& ys) {
    const std::uint64_t xb = kTokensPerStep * hidden_ * 2;
    const std::uint32_t me = ex.current();
    const bool host_exec = options_.host_exec;
    const std::vector<Pick>& sel = selected_[t][l];
    const auto mine = [&](std::size_t i) { return assigned_[t][l][i] == me; };
    // 1. Acquire (pin) this layer's experts, or find the misses.
    std::vector<std::optional<CacheRef>> refs(sel.size());
    std::vector<CacheKey> missed, keys;
    if (cache != nullptr) {
      OffloadCache& here = cache->device_cache(me);
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (!mine(i)) continue;
        const CacheKey key = l * kExperts + sel[i].expert;
        ++device_units[me];
        device_tokens[me] += sel[i].tokens;
        if (host_exec) {
          Result<std::optional<CacheRef>> r = here.acquire_if_resident(key, kCompute);
          if (!r.ok()) return std::move(r).error();
          refs[i] = std::move(*r);
          if (!refs[i]) missed.push_back(key);
        } else {
          Result<DeviceCacheRef> r = cache->acquire(key, me, kCompute);
          if (!r.ok()) return std::move(r).error();
          refs[i] = std::move(r->ref);
        }
      }
      // 2. Hints for the next layer; misses run on the host are admitted too.
      if (options_.prefetch) {
        const std::uint64_t nt = l + 1 < kLayers ? t : t + 1, nl = (l + 1) % kLayers;
        if (nt < kSteps)
          for (std::uint64_t e : predicted_[nt][nl])
            if (home(nl * kExperts + e) == me) keys.push_back(nl * kExperts + e);
      }
      keys.insert(keys.end(), missed.begin(), missed.end());
      if (!keys.empty()) {
        Result<std::uint32_t> p = here.prefetch(keys);
        if (!p.ok()) return std::move(p).error();
      }
    }
    // 3. Device kernels for the resident experts.
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (!mine(i) || (cache != nullptr && !refs[i])) continue;
      const double flops = expert_flops(sel[i].tokens);
      Result<DeviceHandle> gu = ex.alloc(kTokensPerStep * 2 * inter_ * 2, kCompute);
      if (!gu.ok()) return std::move(gu).error();
      // The dry run has no cache: its operands stand in with x.
      const DeviceSlice w_gu = refs[i] ? refs[i]->pieces[0] : DeviceSlice{x};
      const DeviceSlice w_down = refs[i] ? refs[i]->pieces[1] : DeviceSlice{x};
      FERRY_TRY(ex.matmul(kCompute, {x}, w_gu, *gu, gate_up_shape(), flops * 2 / 3));
      Result<DeviceHandle> act = ex.alloc(kTokensPerStep * inter_ * 2, kCompute);
      if (!act.ok()) return std::move(act).error();
      FERRY_TRY(ex.kernel(kCompute, {{*gu}}, *act, 0, kTokensPerStep * 3 * inter_ * 2));
      FERRY_TRY(ex.free(*gu));
      Result<DeviceHandle> y = ex.alloc(xb, kCompute);
      if (!y.ok()) return std::move(y).error();
      ys[i] = *y;
      FERRY_TRY(ex.matmul(kCompute, {*act}, w_down, *y, down_shape(), flops / 3));
      FERRY_TRY(ex.free(*act));
      if (cache != nullptr) FERRY_TRY(cache->release(refs[i]->key, me));
    }
    // 4. Host execution of the misses.
    if (!missed.empty()) FERRY_TRY(host_execute(ex, bank, l, sel, assigned_[t][l], refs, x, x_ready, ys));
    return {};
  }

  // The misses of one layer, on the host: x comes back on its own stream while
  // the device runs the hits; each y_e is computed with the definitions the
  // device uses and uploaded into a fresh buffer the combine reads.
  Result<void> host_execute(Exec& ex, const WeightBank& bank, std::uint64_t l, const std::vector<Pick>& sel,
                            const std::vector<std::uint32_t>& on, const std::vector<std::optional<CacheRef>>& refs,
                            DeviceHandle x,
                            StreamPoint x_ready, std::vector<DeviceHandle>& ys) {
    const std::uint64_t xb = kTokensPerStep * hidden_ * 2;
    const std::uint64_t expert_bytes = 3 * hidden_ * inter_ * 2;
    FERRY_TRY(ex.after(kHostIo, x_ready));
    Result<std::vector<std::byte>> xh = ex.download(kHostIo, x);
    if (!xh.ok()) return std::move(xh).error();
    // The host computes with the device's definitions, materialized (it uploads the bytes).
    Reference ref(ex.gemm(), true);
    const HostValue xv = ref.view(*xh);
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (refs[i] || on[i] != ex.current()) continue;
      const HostValue yv = expert(ref, bank, l * kExperts + sel[i].expert, xv);
      const std::span<const std::byte> y = yv.bytes;
      const double flops = expert_flops(sel[i].tokens);
      const double ns =
          roofline_ns(2000, flops, options_.host_flops_per_s, expert_bytes, options_.host_bytes_per_s);
      ex.host_busy(static_cast<std::uint64_t>(ns));
      ++host_executed;
      Result<DeviceHandle> dev = ex.alloc(xb, kHostIo);
      if (!dev.ok()) return std::move(dev).error();
      ys[i] = *dev;
      TransferPlan plan;
      plan.add(y, *dev);
      Result<Exec::Upload> up = ex.begin_upload(kHostIo, plan);
      if (!up.ok()) return std::move(up).error();
      Result<StreamPoint> done = ex.finish(std::move(*up));
      if (!done.ok()) return std::move(done).error();
      FERRY_TRY(ex.after(kCompute, *done));
    }
    return {};
  }

  const WorkloadOptions& options_;
  std::uint64_t hidden_, inter_;
  std::vector<std::size_t> index_;  // bank index of (layer, expert) gate_up at 2k, down at 2k+1
  std::vector<std::vector<std::vector<Pick>>> selected_;              // [step][layer]
  std::vector<std::vector<std::vector<std::uint64_t>>> predicted_;    // [step][layer]
  std::vector<std::vector<std::vector<std::uint32_t>>> assigned_;     // [step][layer][pick]: the device running it
};

}  // namespace

std::unique_ptr<Workload> make_moe_offload(const WorkloadOptions& options, double scale) {
  return std::make_unique<MoeOffload>(options, scale);
}

}  // namespace ferry::workloads
