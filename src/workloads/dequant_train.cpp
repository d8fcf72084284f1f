// dequant-train (report 003, second account): a QLoRA-style training step over
// 260 frozen int8 weights (65 blocks of qkv [3h, h], o [h, h], up [4h, h],
// down [h, 4h], per-row bf16 scales), each uploaded, dequantized to bf16 for one
// matmul and dropped — in the forward pass and again in the backward pass —
// with a LoRA adapter (rank 16) per weight resident on the device.
//
// Forward, per block (T tokens, hidden h; "." a matmul with W transposed, each
// followed by an in-place kernel adding the LoRA term and any residual):
//   y = x . W1 (+LoRA)        attn = attention(y)
//   o = attn . W2 (+LoRA) + x up = o . W3 (+LoRA)  act = gelu(up)
//   x' = act . W4 (+LoRA) + o
// The input of every matmul (x, attn, o, act) is saved for the backward pass —
// what the LoRA gradients need — which is what builds the pressure: peak live
// comes at the end of the forward pass. Backward walks the blocks in reverse:
// for each weight, dequantize again, dx = dy . W, dLoRA = f(dy, saved input),
// free the saved input; nonlinearity and residual gradients are their own
// kernels. The digest mixes the final dx with every LoRA gradient.
//
// Prefetch on: the next weight's int8 upload runs on the upload stream while the
// current one is verified, dequantized and used. Off: uploads run on the compute stream.
#include <algorithm>
#include <array>

#include "core/align.hpp"
#include "workloads/exec.hpp"

namespace ferry::workloads {
namespace {

constexpr std::uint64_t kBlocks = 65;
constexpr std::uint64_t kWeights = kBlocks * 4;
constexpr std::uint64_t kTokens = 4096;
constexpr std::array<const char*, 4> kNames = {"qkv", "o", "up", "down"};

class DequantTrain final : public Workload {
 public:
  DequantTrain(const WorkloadOptions& options, double s) : options_(options), s_(s) {
    h_ = scaled(4096, s);
    tokens_ = scaled(kTokens, s);
    rank_ = scaled(16, s);
  }

  std::string shape() const override {
    return std::to_string(kWeights) + " int8 weights (" + std::to_string(kBlocks) + " blocks), hidden " +
           std::to_string(h_) + ", " + std::to_string(tokens_) + " tokens, LoRA rank " + std::to_string(rank_) +
           ", forward + backward";
  }

  // in/out features of block weight j.
  std::uint64_t in_of(std::uint64_t j) const { return j == 3 ? 4 * h_ : h_; }
  std::uint64_t out_of(std::uint64_t j) const { return j == 0 ? 3 * h_ : j == 2 ? 4 * h_ : h_; }
  std::uint64_t lora_bytes(std::uint64_t j) const { return rank_ * (in_of(j) + out_of(j)) * 2; }

  std::vector<SyntheticTensor> tensors() const override {
    std::vector<SyntheticTensor> out;
    for (std::uint64_t b = 0; b < kBlocks; ++b) {
      for (std::uint64_t j = 0; j < 4; ++j) {
        const std::string p = "blocks." + std::to_string(b) + "." + kNames[j];
        out.push_back(tensor(p + ".qweight", DType::i8, {out_of(j), in_of(j)}));
        out.push_back(tensor(p + ".scales", DType::bf16, {out_of(j)}));
      }
    }
    return out;
  }

  Result<void> bind(const WeightBank& bank) override {
    Result<std::vector<std::size_t>> index = resolve_tensors(bank, tensors());
    if (!index.ok()) return std::move(index).error();
    index_ = std::move(index).value();
    return {};
  }

  std::uint64_t reference(Reference& ref, const WeightBank& bank) override {
    const std::uint64_t T = tokens_, h = h_;
    // Weight i dequantized, made again for each use as the device does.
    const auto w = [&](std::uint64_t i) {
      const std::size_t q = index_[2 * i], sc = index_[2 * i + 1];
      return ref.kernel({ref.weight(bank, q), ref.weight(bank, sc)},
                        in_of(i % 4) * out_of(i % 4) * 2);
    };
    std::vector<HostValue> lora(kWeights), saved(kWeights);
    std::vector<std::uint64_t> dlora(kWeights);
    for (std::uint64_t i = 0; i < kWeights; ++i) lora[i] = ref.fill(lora_seed(i), lora_bytes(i % 4));
    HostValue x = ref.fill(input_seed(), T * h * 2);
    for (std::uint64_t b = 0; b < kBlocks; ++b) {
      const std::uint64_t i = 4 * b;
      saved[i] = x;
      const HostValue y = ref.kernel({ref.matmul(x, w(i), forward(0)), lora[i]}, T * 3 * h * 2);
      const HostValue attn = ref.kernel({y}, T * h * 2);
      saved[i + 1] = attn;
      const HostValue o = ref.kernel({ref.matmul(attn, w(i + 1), forward(1)), lora[i + 1], x}, T * h * 2);
      saved[i + 2] = o;
      const HostValue up = ref.kernel({ref.matmul(o, w(i + 2), forward(2)), lora[i + 2]}, T * 4 * h * 2);
      const HostValue act = ref.kernel({up}, T * 4 * h * 2);
      saved[i + 3] = act;
      x = ref.kernel({ref.matmul(act, w(i + 3), forward(3)), lora[i + 3], o}, T * h * 2);
    }
    HostValue dy = ref.kernel({x}, T * h * 2);
    for (std::uint64_t bb = kBlocks; bb-- > 0;) {
      const std::uint64_t i = 4 * bb;
      const HostValue d_act = ref.kernel({ref.matmul(dy, w(i + 3), backward(3)), lora[i + 3]}, T * 4 * h * 2);
      dlora[i + 3] = ref.kernel({dy, saved[i + 3], lora[i + 3]}, lora_bytes(3)).hash;
      const HostValue d_up = ref.kernel({d_act}, T * 4 * h * 2);
      const HostValue d_o1 = ref.kernel({ref.matmul(d_up, w(i + 2), backward(2)), lora[i + 2]}, T * h * 2);
      dlora[i + 2] = ref.kernel({d_up, saved[i + 2], lora[i + 2]}, lora_bytes(2)).hash;
      const HostValue d_o = ref.kernel({d_o1, dy}, T * h * 2);
      const HostValue d_attn = ref.kernel({ref.matmul(d_o, w(i + 1), backward(1)), lora[i + 1]}, T * h * 2);
      dlora[i + 1] = ref.kernel({d_o, saved[i + 1], lora[i + 1]}, lora_bytes(1)).hash;
      const HostValue d_qkv = ref.kernel({d_attn}, T * 3 * h * 2);
      const HostValue d_x1 = ref.kernel({ref.matmul(d_qkv, w(i), backward(0)), lora[i]}, T * h * 2);
      dlora[i] = ref.kernel({d_qkv, saved[i], lora[i]}, lora_bytes(0)).hash;
      dy = ref.kernel({d_x1, d_o}, T * h * 2);
      saved[i] = saved[i + 1] = saved[i + 2] = saved[i + 3] = HostValue{};  // their last use
    }
    std::vector<std::uint64_t> digest{dy.hash};
    digest.insert(digest.end(), dlora.begin(), dlora.end());
    return Reference::mix(digest);
  }

  Result<std::vector<std::byte>> execute(Exec& ex, const WeightBank& bank) override {
    const std::uint64_t T = tokens_, h = h_;
    up_stream_ = options_.prefetch ? kUpload : kCompute;
    passes_.clear();
    for (std::uint64_t i = 0; i < kWeights; ++i) passes_.push_back(i);
    for (std::uint64_t i = kWeights; i-- > 0;) passes_.push_back(i);
    staged_.clear();
    staged_.resize(passes_.size());
    next_pass_ = 0;

    std::vector<DeviceHandle> lora(kWeights), dlora(kWeights), saved(kWeights);
    for (std::uint64_t i = 0; i < kWeights; ++i) {
      Result<DeviceHandle> l = ex.alloc(lora_bytes(i % 4), kCompute);
      if (!l.ok()) return std::move(l).error();
      lora[i] = *l;
      FERRY_TRY(ex.fill(kCompute, lora[i], lora_seed(i)));
    }
    DeviceHandle x{};
    FERRY_TRY(alloc_to(ex, T * h * 2, x));
    FERRY_TRY(ex.fill(kCompute, x, input_seed()));

    // --- forward
    for (std::uint64_t b = 0; b < kBlocks; ++b) FERRY_TRY(forward_block(ex, bank, 4 * b, lora, saved, x));
    DeviceHandle dy{};
    FERRY_TRY(alloc_to(ex, T * h * 2, dy));
    FERRY_TRY(ex.kernel(kCompute, {{x}}, dy, 0, 2 * T * h * 2));  // loss gradient
    FERRY_TRY(ex.free(x));

    // --- backward
    for (std::uint64_t bb = kBlocks; bb-- > 0;) FERRY_TRY(backward_block(ex, bank, 4 * bb, lora, saved, dlora, dy));

    DeviceHandle digest{};
    FERRY_TRY(alloc_to(ex, kDigestBytes, digest));
    std::vector<DeviceSlice> in{{dy}};
    std::uint64_t grad_bytes = 0;
    for (std::uint64_t i = 0; i < kWeights; ++i) {
      in.push_back({dlora[i]});
      grad_bytes += lora_bytes(i % 4);
    }
    FERRY_TRY(ex.kernel(kCompute, in, digest, 0, T * h * 2 + grad_bytes + kDigestBytes));
    FERRY_TRY(ex.free(dy));
    for (std::uint64_t i = 0; i < kWeights; ++i) {
      FERRY_TRY(ex.free(dlora[i]));
      FERRY_TRY(ex.free(lora[i]));
    }
    Result<std::vector<std::byte>> bytes = ex.download(kCompute, digest);
    FERRY_TRY(ex.free(digest));
    return bytes;
  }

  // Block i/4 of the forward pass: weights i..i+3, from x to the next x; keeps
  // what the backward pass reads in saved[i..i+3].
  Result<void> forward_block(Exec& ex, const WeightBank& bank, std::uint64_t i, const std::vector<DeviceHandle>& lora,
                             std::vector<DeviceHandle>& saved, DeviceHandle& x) {
    const std::uint64_t T = tokens_, h = h_;
    DeviceHandle w{}, y{}, attn{}, o{}, up{}, act{}, next{};
    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * 3 * h * 2, y));
    FERRY_TRY(ex.matmul(kCompute, {x}, {w}, y, forward(0), mm_flops(0)));
    FERRY_TRY(lora_term(ex, y, {{y}, {lora[i]}}, 0));
    FERRY_TRY(ex.free(w));
    saved[i] = x;
    FERRY_TRY(alloc_to(ex, T * h * 2, attn));
    FERRY_TRY(ex.kernel(kCompute, {{y}}, attn, attn_flops(), (T * 3 * h + T * h) * 2));
    FERRY_TRY(ex.free(y));
    ex.progress("forward", i + 1, kWeights);

    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * h * 2, o));
    FERRY_TRY(ex.matmul(kCompute, {attn}, {w}, o, forward(1), mm_flops(1)));
    FERRY_TRY(lora_term(ex, o, {{o}, {lora[i + 1]}, {x}}, 1));  // + LoRA + x
    FERRY_TRY(ex.free(w));
    saved[i + 1] = attn;
    ex.progress("forward", i + 2, kWeights);

    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * 4 * h * 2, up));
    FERRY_TRY(ex.matmul(kCompute, {o}, {w}, up, forward(2), mm_flops(2)));
    FERRY_TRY(lora_term(ex, up, {{up}, {lora[i + 2]}}, 2));
    FERRY_TRY(ex.free(w));
    saved[i + 2] = o;
    FERRY_TRY(alloc_to(ex, T * 4 * h * 2, act));
    FERRY_TRY(ex.kernel(kCompute, {{up}}, act, 0, 2 * T * 4 * h * 2));
    FERRY_TRY(ex.free(up));
    ex.progress("forward", i + 3, kWeights);

    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * h * 2, next));
    FERRY_TRY(ex.matmul(kCompute, {act}, {w}, next, forward(3), mm_flops(3)));
    FERRY_TRY(lora_term(ex, next, {{next}, {lora[i + 3]}, {o}}, 3));  // + LoRA + o
    FERRY_TRY(ex.free(w));
    saved[i + 3] = act;
    x = next;
    ex.progress("forward", i + 4, kWeights);
    return {};
  }

  // Block i/4 of the backward pass: weights i+3..i, from dy to the next dy; the
  // LoRA gradients into dlora[i..i+3].
  Result<void> backward_block(Exec& ex, const WeightBank& bank, std::uint64_t i,
                              const std::vector<DeviceHandle>& lora, std::vector<DeviceHandle>& saved,
                              std::vector<DeviceHandle>& dlora, DeviceHandle& dy) {
    const std::uint64_t T = tokens_, h = h_;
    DeviceHandle w{}, d_act{}, d_up{}, d_o1{}, d_o{}, d_attn{}, d_qkv{}, d_x1{}, next{};
    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * 4 * h * 2, d_act));
    FERRY_TRY(ex.matmul(kCompute, {dy}, {w}, d_act, backward(3), mm_flops(3)));
    FERRY_TRY(lora_term(ex, d_act, {{d_act}, {lora[i + 3]}}, 3));
    FERRY_TRY(lora_grad(ex, dy, saved[i + 3], lora[i + 3], 3, dlora[i + 3]));
    FERRY_TRY(ex.free(w));
    FERRY_TRY(alloc_to(ex, T * 4 * h * 2, d_up));
    FERRY_TRY(ex.kernel(kCompute, {{d_act}}, d_up, 0, 2 * T * 4 * h * 2));
    FERRY_TRY(ex.free(d_act));
    ex.progress("backward", kWeights - i - 3, kWeights);

    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * h * 2, d_o1));
    FERRY_TRY(ex.matmul(kCompute, {d_up}, {w}, d_o1, backward(2), mm_flops(2)));
    FERRY_TRY(lora_term(ex, d_o1, {{d_o1}, {lora[i + 2]}}, 2));
    FERRY_TRY(lora_grad(ex, d_up, saved[i + 2], lora[i + 2], 2, dlora[i + 2]));
    FERRY_TRY(ex.free(w));
    FERRY_TRY(ex.free(d_up));
    FERRY_TRY(alloc_to(ex, T * h * 2, d_o));
    FERRY_TRY(ex.kernel(kCompute, {{d_o1}, {dy}}, d_o, 0, 3 * T * h * 2));
    FERRY_TRY(ex.free(d_o1));
    FERRY_TRY(ex.free(dy));
    ex.progress("backward", kWeights - i - 2, kWeights);

    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * h * 2, d_attn));
    FERRY_TRY(ex.matmul(kCompute, {d_o}, {w}, d_attn, backward(1), mm_flops(1)));
    FERRY_TRY(lora_term(ex, d_attn, {{d_attn}, {lora[i + 1]}}, 1));
    FERRY_TRY(lora_grad(ex, d_o, saved[i + 1], lora[i + 1], 1, dlora[i + 1]));
    FERRY_TRY(ex.free(w));
    FERRY_TRY(alloc_to(ex, T * 3 * h * 2, d_qkv));
    FERRY_TRY(ex.kernel(kCompute, {{d_attn}}, d_qkv, 2 * attn_flops(), (T * h + T * 3 * h) * 2));
    FERRY_TRY(ex.free(d_attn));
    ex.progress("backward", kWeights - i - 1, kWeights);

    FERRY_TRY(dequantized(ex, bank, w));
    FERRY_TRY(alloc_to(ex, T * h * 2, d_x1));
    FERRY_TRY(ex.matmul(kCompute, {d_qkv}, {w}, d_x1, backward(0), mm_flops(0)));
    FERRY_TRY(lora_term(ex, d_x1, {{d_x1}, {lora[i]}}, 0));
    FERRY_TRY(lora_grad(ex, d_qkv, saved[i], lora[i], 0, dlora[i]));
    FERRY_TRY(ex.free(w));
    FERRY_TRY(ex.free(d_qkv));
    FERRY_TRY(alloc_to(ex, T * h * 2, next));
    FERRY_TRY(ex.kernel(kCompute, {{d_x1}, {d_o}}, next, 0, 3 * T * h * 2));
    FERRY_TRY(ex.free(d_x1));
    FERRY_TRY(ex.free(d_o));
    dy = next;
    ex.progress("backward", kWeights - i, kWeights);
    return {};
  }

  std::uint64_t nominal_tokens() const override { return kTokens; }
  std::uint64_t units() const override { return 2 * kWeights; }
  std::string unit_name() const override { return "weight passes"; }

 private:
  struct Staged {
    DeviceHandle buf{};
    Exec::Upload upload;
    bool begun = false;
  };

  SyntheticTensor tensor(std::string name, DType dtype, std::vector<std::uint64_t> shape) const {
    const std::uint64_t seed = splitmix64(options_.seed ^ fnv1a(name));
    return SyntheticTensor{std::move(name), dtype, std::move(shape), seed,
                           dtype == DType::bf16 ? kPattern : Pattern::bytes};
  }
  std::uint64_t input_seed() const { return splitmix64(options_.seed ^ fnv1a("dequant-train.input")); }
  std::uint64_t lora_seed(std::uint64_t i) const {
    return splitmix64(options_.seed ^ fnv1a("dequant-train.lora") ^ (i * 0x9e3779b97f4a7c15ull));
  }

  // Weight j's matmuls: forward y[T, out] = x[T, in] . W^T, backward
  // dx[T, in] = dy[T, out] . W (W is [out, in]).
  GemmShape forward(std::uint64_t j) const {
    return {static_cast<std::uint32_t>(tokens_), static_cast<std::uint32_t>(out_of(j)),
            static_cast<std::uint32_t>(in_of(j)), false, true};
  }
  GemmShape backward(std::uint64_t j) const {
    return {static_cast<std::uint32_t>(tokens_), static_cast<std::uint32_t>(in_of(j)),
            static_cast<std::uint32_t>(out_of(j)), false, false};
  }

  // Charged at the nominal token count (see workload.hpp): / s.
  double mm_flops(std::uint64_t j) const {
    return 2 * static_cast<double>(tokens_) * static_cast<double>(in_of(j)) * static_cast<double>(out_of(j)) / s_;
  }
  double lora_flops(std::uint64_t j) const {
    return 2 * static_cast<double>(tokens_) * static_cast<double>(rank_) * static_cast<double>(in_of(j) + out_of(j)) /
           s_;
  }
  double attn_flops() const {
    const double T = static_cast<double>(tokens_);
    return 2 * T * T * static_cast<double>(h_) / s_;
  }

  // The LoRA term (and a residual) added to a matmul's output `out` in place:
  // inputs are {out, lora, residual...}.
  Result<void> lora_term(Exec& ex, DeviceHandle out, const std::vector<DeviceSlice>& inputs, std::uint64_t j) {
    const std::uint64_t residual_bytes = inputs.size() > 2 ? tokens_ * h_ * 2 : 0;
    Result<StreamPoint> p = ex.kernel(kCompute, inputs, out, lora_flops(j),
                                      tokens_ * (in_of(j) + out_of(j)) * 2 + lora_bytes(j) + residual_bytes);
    if (!p.ok()) return std::move(p).error();
    return {};
  }

  Result<void> alloc_to(Exec& ex, std::uint64_t bytes, DeviceHandle& out) {
    Result<DeviceHandle> h = ex.alloc(bytes, kCompute);
    if (!h.ok()) return std::move(h).error();
    out = *h;
    return {};
  }

  Result<void> lora_grad(Exec& ex, DeviceHandle dy, DeviceHandle& saved_input, DeviceHandle lora,
                         std::uint64_t j, DeviceHandle& grad) {
    FERRY_TRY(alloc_to(ex, lora_bytes(j), grad));
    const double T = static_cast<double>(tokens_), r = static_cast<double>(rank_);
    const double flops = 4 * T * r * static_cast<double>(in_of(j) + out_of(j)) / s_;
    FERRY_TRY(ex.kernel(kCompute, {{dy}, {saved_input}, {lora}}, grad, flops,
                        tokens_ * (in_of(j) + out_of(j)) * 2 + 2 * lora_bytes(j)));
    FERRY_TRY(ex.free(saved_input));  // the saved activation's last use
    saved_input = {};
    return {};
  }

  // Starts the upload of pass k's int8 weight and scales into one buffer.
  // Returns false when a prefetch found no device memory.
  Result<bool> begin(Exec& ex, const WeightBank& bank, std::size_t k, bool is_prefetch) {
    const std::uint64_t i = passes_[k];
    const TensorInfo& q = bank.tensors()[index_[2 * i]];
    const TensorInfo& sc = bank.tensors()[index_[2 * i + 1]];
    const std::uint64_t soff = detail::align_up(q.bytes, detail::kBlockAlign);
    Result<DeviceHandle> buf = ex.alloc(soff + sc.bytes, up_stream_);
    if (!buf.ok()) {
      if (is_prefetch && buf.error().code == ErrorCode::out_of_memory) return false;
      return std::move(buf).error();
    }
    Exec::WeightUpload plan(bank);
    FERRY_TRY(ex.add_weights(plan, index_[2 * i], 0, q.bytes, *buf, 0));
    FERRY_TRY(ex.add_weights(plan, index_[2 * i + 1], 0, sc.bytes, *buf, soff));
    Result<Exec::Upload> u = ex.begin_upload(up_stream_, std::move(plan));
    if (!u.ok()) return std::move(u).error();
    staged_[k].buf = *buf;
    staged_[k].upload = std::move(*u);
    staged_[k].begun = true;
    return true;
  }

  // The next pass's weight, uploaded (prefetching the one after) and
  // dequantized into a fresh bf16 buffer; the int8 buffer is dropped.
  Result<void> dequantized(Exec& ex, const WeightBank& bank, DeviceHandle& out) {
    const std::size_t k = next_pass_++;
    const std::uint64_t i = passes_[k], j = i % 4;
    if (!staged_[k].begun) {
      Result<bool> b = begin(ex, bank, k, false);
      if (!b.ok()) return std::move(b).error();
    }
    // The next upload starts before this one is finished: under verify, finish
    // waits for a device hash that queues behind kernels, and the host link
    // would sit idle meanwhile.
    if (options_.prefetch && k + 1 < passes_.size()) {
      Result<bool> b = begin(ex, bank, k + 1, true);
      if (!b.ok()) return std::move(b).error();
      if (!*b) ++prefetch_skipped;
    }
    Result<StreamPoint> done = ex.finish(std::move(staged_[k].upload));
    if (!done.ok()) return std::move(done).error();
    FERRY_TRY(ex.after(kCompute, *done));
    const TensorInfo& q = bank.tensors()[index_[2 * i]];
    const TensorInfo& sc = bank.tensors()[index_[2 * i + 1]];
    const std::uint64_t soff = detail::align_up(q.bytes, detail::kBlockAlign);
    const std::uint64_t w_bytes = in_of(j) * out_of(j) * 2;
    FERRY_TRY(alloc_to(ex, w_bytes, out));
    const DeviceHandle buf = staged_[k].buf;
    FERRY_TRY(ex.kernel(kCompute, {{buf, 0, q.bytes}, {buf, soff, sc.bytes}}, out, 0, q.bytes + sc.bytes + w_bytes));
    FERRY_TRY(ex.free(buf));
    staged_[k].buf = {};
    return {};
  }

  const WorkloadOptions& options_;
  double s_;
  std::uint64_t h_, tokens_, rank_;
  std::vector<std::size_t> index_;  // weight i: qweight at 2i, scales at 2i+1
  StreamId up_stream_ = kUpload;
  std::vector<std::uint64_t> passes_;  // weight index per pass: forward, then backward
  std::vector<Staged> staged_;
  std::size_t next_pass_ = 0;
};

}  // namespace

std::unique_ptr<Workload> make_dequant_train(const WorkloadOptions& options, double scale) {
  return std::make_unique<DequantTrain>(options, scale);
}

}  // namespace ferry::workloads
