// dense-stream (report 003): a dense transformer forward whose weights are
// streamed a layer at a time — upload -> matmul -> drop — with the next layer's
// weights prefetched on a copy stream, then a chunked full-vocabulary logits
// projection whose chunks are streamed the same way and reduced.
//
// Per layer (T tokens, hidden h, bf16; every buffer freed right after its last
// consumer is enqueued, weights right after their one matmul; "." is a matmul
// with the weight transposed, the rest are kernels):
//   qkv  = x . Wqkv          [T, q+2kv]
//   attn = attention(qkv)    [T, q]      causal, one sequence of T tokens
//   o    = attn . Wo, o += x [T, h]      the residual add in place
//   gu   = o . Wgu           [T, 2I]
//   act  = silu(gate) * up   [T, I]
//   x'   = act . Wdown, x' += o  [T, h]
// Logits: for each chunk of at most `chunk` vocabulary rows, logits = x . Wc
// [T, n] then red = reduce(logits) [T, 8 B]; digest = mix(red..., x).
//
// Prefetch on: uploads run on the upload stream one weight group (a layer, or a
// logits chunk) ahead of the compute stream. Prefetch off: each group is
// uploaded on the compute stream right before it is used (strictly upload,
// compute, upload, ...). A prefetch that finds no device memory is skipped and
// the group is loaded on demand instead (counted in prefetch_skipped).
#include <algorithm>

#include "workloads/exec.hpp"

namespace ferry::workloads {
namespace {

struct Range {
  std::size_t tensor = 0;
  std::uint64_t offset = 0, bytes = 0;
};

class DenseStream final : public Workload {
 public:
  DenseStream(const WorkloadOptions& options, double s) : options_(options), s_(s) {
    hidden_ = scaled(2560, s);
    q_ = scaled(4096, s);
    kv_ = scaled(1024, s);
    inter_ = scaled(9728, s);
    vocab_ = scaled(151936, s);
    chunk_ = std::min(vocab_, scaled(65536, s));
    tokens_ = scaled(kTokens, s);
  }

  std::string shape() const override {
    return std::to_string(kLayers) + " layers, hidden " + std::to_string(hidden_) + ", q/kv " +
           std::to_string(q_) + "/" + std::to_string(kv_) + ", intermediate " + std::to_string(inter_) +
           ", vocab " + std::to_string(vocab_) + " in chunks of <= " + std::to_string(chunk_) + ", " +
           std::to_string(tokens_) + " tokens, bf16";
  }

  std::vector<SyntheticTensor> tensors() const override {
    std::vector<SyntheticTensor> out;
    for (std::uint64_t i = 0; i < kLayers; ++i) {
      const std::string p = "model.layers." + std::to_string(i);
      out.push_back(tensor(p + ".self_attn.qkv_proj.weight", {q_ + 2 * kv_, hidden_}));
      out.push_back(tensor(p + ".self_attn.o_proj.weight", {hidden_, q_}));
      out.push_back(tensor(p + ".mlp.gate_up_proj.weight", {2 * inter_, hidden_}));
      out.push_back(tensor(p + ".mlp.down_proj.weight", {hidden_, inter_}));
    }
    out.push_back(tensor("lm_head.weight", {vocab_, hidden_}));
    return out;
  }

  Result<void> bind(const WeightBank& bank) override {
    Result<std::vector<std::size_t>> index = resolve_tensors(bank, tensors());
    if (!index.ok()) return std::move(index).error();
    // A synthetic bank is small_bf16 by construction; a file must be checked.
    if (uses_gemm(options_) && !options_.weights_path.empty()) FERRY_TRY(check_gemm_weights(bank, *index));
    layer_ = std::move(index).value();
    lm_head_ = layer_.back();
    layer_.pop_back();
    groups_.clear();
    for (std::uint64_t i = 0; i < kLayers; ++i) {
      std::vector<Range> g;
      for (std::size_t j = 0; j < 4; ++j) {
        const std::size_t t = layer_[i * 4 + j];
        g.push_back({t, 0, bank.tensors()[t].bytes});
      }
      groups_.push_back(std::move(g));
    }
    for (std::uint64_t row = 0; row < vocab_; row += chunk_) {
      const std::uint64_t n = std::min(chunk_, vocab_ - row);
      groups_.push_back({Range{lm_head_, row * hidden_ * 2, n * hidden_ * 2}});
    }
    return {};
  }

  std::uint64_t reference(Reference& ref, const WeightBank& bank) override {
    const std::uint64_t T = tokens_, h = hidden_, qkv_n = q_ + 2 * kv_, I = inter_;
    HostValue x = ref.fill(input_seed(), T * h * 2);
    for (std::uint64_t i = 0; i < kLayers; ++i) {
      const auto w = [&](std::size_t j) { return ref.weight(bank, layer_[i * 4 + j]); };
      const HostValue qkv = ref.matmul(x, w(0), linear(T, qkv_n, h));
      const HostValue attn = ref.kernel({qkv}, T * q_ * 2);
      const HostValue o = ref.kernel({ref.matmul(attn, w(1), linear(T, h, q_)), x}, T * h * 2);
      const HostValue gu = ref.matmul(o, w(2), linear(T, 2 * I, h));
      const HostValue act = ref.kernel({gu}, T * I * 2);
      x = ref.kernel({ref.matmul(act, w(3), linear(T, h, I)), o}, T * h * 2);
    }
    std::vector<std::uint64_t> reds;
    for (std::size_t g = kLayers; g < groups_.size(); ++g) {
      const Range& r = groups_[g][0];
      const HostValue wc = ref.weight(bank, r.tensor, r.offset, r.bytes);
      const std::uint64_t n = r.bytes / (h * 2);
      const HostValue logits = ref.matmul(x, wc, linear(T, n, h));
      reds.push_back(ref.kernel({logits}, T * 8).hash);
    }
    reds.push_back(x.hash);
    return Reference::mix(reds);
  }

  Result<std::vector<std::byte>> execute(Exec& ex, const WeightBank& bank) override {
    const bool prefetch = options_.prefetch;
    const StreamId up_stream = prefetch ? kUpload : kCompute;
    const std::uint64_t T = tokens_, h = hidden_;
    Result<DeviceHandle> x0 = ex.alloc(T * h * 2, kCompute);
    if (!x0.ok()) return std::move(x0).error();
    DeviceHandle x = *x0;
    FERRY_TRY(ex.fill(kCompute, x, input_seed()));

    const std::uint32_t devices = ex.device_count();
    device_units.assign(devices, 0);
    device_tokens.assign(devices, 0);
    std::uint32_t x_device = 0;
    std::vector<Staged> staged(groups_.size());
    const auto begin = [&](std::size_t g, bool is_prefetch) -> Result<bool> {
      ex.on(device_of_group(g, devices));  // a prefetch may load the next device's first group
      Staged& st = staged[g];
      Exec::WeightUpload plan(bank);
      for (const Range& r : groups_[g]) {
        Result<DeviceHandle> b = ex.alloc(r.bytes, up_stream);
        if (!b.ok()) {
          for (DeviceHandle done : st.bufs) (void)ex.free(done);
          st.bufs.clear();
          if (is_prefetch && b.error().code == ErrorCode::out_of_memory) return false;
          return std::move(b).error();
        }
        st.bufs.push_back(*b);
        FERRY_TRY(ex.add_weights(plan, r.tensor, r.offset, r.bytes, *b, 0));
      }
      Result<Exec::Upload> u = ex.begin_upload(up_stream, std::move(plan));
      if (!u.ok()) return std::move(u).error();
      st.upload = std::move(*u);
      st.begun = true;
      return true;
    };

    std::vector<DeviceHandle> reds;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (!staged[g].begun) {
        Result<bool> b = begin(g, false);
        if (!b.ok()) return std::move(b).error();
      }
      // The next group's upload starts before this one is finished: under
      // verify, finish waits for a device hash that queues behind kernels, and
      // the host link would sit idle meanwhile.
      if (prefetch && g + 1 < groups_.size()) {
        Result<bool> b = begin(g + 1, true);
        if (!b.ok()) return std::move(b).error();
        if (!*b) ++prefetch_skipped;
      }
      const std::uint32_t here = device_of_group(g, devices);
      ex.on(here);
      if (here != x_device) {  // the pipeline's hand-over: the activations move to the next device
        Result<Exec::Moved> moved = ex.copy_to(here, x, kCompute);
        if (!moved.ok()) return std::move(moved).error();
        FERRY_TRY(ex.free(x));
        x = moved->handle;
        x_device = here;
      }
      Result<StreamPoint> done = ex.finish(std::move(staged[g].upload));
      if (!done.ok()) return std::move(done).error();
      FERRY_TRY(ex.after(kCompute, *done));
      const std::vector<DeviceHandle> w = std::move(staged[g].bufs);
      device_tokens[here] = kTokens;  // every token passes through every device's layers
      if (g < kLayers) {
        ++device_units[here];
        FERRY_TRY(layer(ex, w, x));
        ex.progress("layers", g + 1, kLayers);
      } else {
        const std::uint64_t n = groups_[g][0].bytes / (h * 2);
        Result<DeviceHandle> logits = ex.alloc(T * n * 2, kCompute);
        if (!logits.ok()) return std::move(logits).error();
        FERRY_TRY(ex.matmul(kCompute, {x}, {w[0]}, *logits, linear(T, n, h), matmul_flops(T, h, n)));
        FERRY_TRY(ex.free(w[0]));
        Result<DeviceHandle> red = ex.alloc(T * 8, kCompute);
        if (!red.ok()) return std::move(red).error();
        FERRY_TRY(ex.kernel(kCompute, {{*logits}}, *red, 0, T * n * 2 + T * 8));
        FERRY_TRY(ex.free(*logits));
        reds.push_back(*red);
        ex.progress("logits", g + 1 - kLayers, groups_.size() - kLayers);
      }
    }
    Result<DeviceHandle> digest = ex.alloc(kDigestBytes, kCompute);
    if (!digest.ok()) return std::move(digest).error();
    std::vector<DeviceSlice> in;
    for (DeviceHandle r : reds) in.push_back({r});
    in.push_back({x});
    FERRY_TRY(ex.kernel(kCompute, in, *digest, 0, reds.size() * T * 8 + T * h * 2 + kDigestBytes));
    for (DeviceHandle r : reds) FERRY_TRY(ex.free(r));
    FERRY_TRY(ex.free(x));
    Result<std::vector<std::byte>> bytes = ex.download(kCompute, *digest);
    FERRY_TRY(ex.free(*digest));
    return bytes;
  }

  std::uint64_t nominal_tokens() const override { return kTokens; }
  std::uint64_t units() const override { return kLayers; }
  std::string unit_name() const override { return "layers"; }

 private:
  static constexpr std::uint64_t kLayers = 36;
  static constexpr std::uint64_t kTokens = 4096;

  struct Staged {
    std::vector<DeviceHandle> bufs;
    Exec::Upload upload;
    bool begun = false;
  };

  SyntheticTensor tensor(std::string name, std::vector<std::uint64_t> shape) const {
    const std::uint64_t seed = splitmix64(options_.seed ^ fnv1a(name));
    return SyntheticTensor{std::move(name), DType::bf16, std::move(shape), seed, kPattern};
  }
  // [m, k] activations times a [n, k] weight, transposed.
  static GemmShape linear(std::uint64_t m, std::uint64_t n, std::uint64_t k) {
    return {static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(k), false, true};
  }
  // The pipeline: layer i on device i * N / layers (contiguous runs), the logits on the last device.
  static std::uint32_t device_of_group(std::size_t g, std::uint32_t n) {
    if (g >= kLayers) return n - 1;
    return static_cast<std::uint32_t>(g * n / kLayers);
  }
  std::uint64_t input_seed() const { return splitmix64(options_.seed ^ fnv1a("dense-stream.input")); }

  // Charged at the nominal token count (see workload.hpp): / s.
  double matmul_flops(std::uint64_t m, std::uint64_t k, std::uint64_t n) const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) / s_;
  }

  Result<void> layer(Exec& ex, const std::vector<DeviceHandle>& w, DeviceHandle& x) {
    const std::uint64_t T = tokens_, h = hidden_, q = q_, qkv_n = q_ + 2 * kv_, I = inter_;
    const auto alloc = [&](std::uint64_t bytes) { return ex.alloc(bytes, kCompute); };
    Result<DeviceHandle> qkv = alloc(T * qkv_n * 2);
    if (!qkv.ok()) return std::move(qkv).error();
    FERRY_TRY(ex.matmul(kCompute, {x}, {w[0]}, *qkv, linear(T, qkv_n, h), matmul_flops(T, h, qkv_n)));
    FERRY_TRY(ex.free(w[0]));
    Result<DeviceHandle> attn = alloc(T * q * 2);
    if (!attn.ok()) return std::move(attn).error();
    const double attn_flops = 2.0 * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(q) / s_;
    FERRY_TRY(ex.kernel(kCompute, {{*qkv}}, *attn, attn_flops, (T * qkv_n + T * q) * 2));
    FERRY_TRY(ex.free(*qkv));
    Result<DeviceHandle> o = alloc(T * h * 2);
    if (!o.ok()) return std::move(o).error();
    FERRY_TRY(ex.matmul(kCompute, {*attn}, {w[1]}, *o, linear(T, h, q), matmul_flops(T, q, h)));
    FERRY_TRY(ex.kernel(kCompute, {{*o}, {x}}, *o, 0, 3 * T * h * 2));  // + x, in place
    FERRY_TRY(ex.free(w[1]));
    FERRY_TRY(ex.free(*attn));
    FERRY_TRY(ex.free(x));
    Result<DeviceHandle> gu = alloc(T * 2 * I * 2);
    if (!gu.ok()) return std::move(gu).error();
    FERRY_TRY(ex.matmul(kCompute, {*o}, {w[2]}, *gu, linear(T, 2 * I, h), matmul_flops(T, h, 2 * I)));
    FERRY_TRY(ex.free(w[2]));
    Result<DeviceHandle> act = alloc(T * I * 2);
    if (!act.ok()) return std::move(act).error();
    FERRY_TRY(ex.kernel(kCompute, {{*gu}}, *act, 0, (T * 2 * I + T * I) * 2));
    FERRY_TRY(ex.free(*gu));
    Result<DeviceHandle> next = alloc(T * h * 2);
    if (!next.ok()) return std::move(next).error();
    FERRY_TRY(ex.matmul(kCompute, {*act}, {w[3]}, *next, linear(T, h, I), matmul_flops(T, I, h)));
    FERRY_TRY(ex.kernel(kCompute, {{*next}, {*o}}, *next, 0, 3 * T * h * 2));  // + o, in place
    FERRY_TRY(ex.free(w[3]));
    FERRY_TRY(ex.free(*act));
    FERRY_TRY(ex.free(*o));
    x = *next;
    return {};
  }

  const WorkloadOptions& options_;
  double s_;
  std::uint64_t hidden_, q_, kv_, inter_, vocab_, chunk_, tokens_;
  std::vector<std::size_t> layer_;  // bank indices, 4 per layer
  std::size_t lm_head_ = 0;
  std::vector<std::vector<Range>> groups_;  // layers, then logits chunks
};

}  // namespace

std::unique_ptr<Workload> make_dense_stream(const WorkloadOptions& options, double scale) {
  return std::make_unique<DenseStream>(options, scale);
}

}  // namespace ferry::workloads
