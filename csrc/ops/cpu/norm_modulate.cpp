// The CPU kernels of every norm-modulate op, both norms, plain and gated: one row at a time in
// the accumulation type (fp32; fp64 for fp64 x), rows in parallel (at::parallel_for). The
// problem's `rms` drops the mean; its h (the gated ops) forms r = residual + gate * h first.
#include "norm_modulate.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace adaptiveload {
namespace {

// Rows are converted to the accumulation type one at a time; the dtype switch runs once per row.
template <typename acc_t>
void load_row(const at::Tensor& t, int64_t offset, int64_t n, acc_t* dst) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, t.scalar_type(), "load_row", [&] {
    const scalar_t* src = t.const_data_ptr<scalar_t>() + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<acc_t>(src[i]);
  });
}

template <typename acc_t>
void store_row(at::Tensor& t, int64_t offset, int64_t n, const acc_t* src) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, t.scalar_type(), "store_row", [&] {
    scalar_t* dst = t.mutable_data_ptr<scalar_t>() + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<scalar_t>(src[i]);
  });
}

template <typename acc_t>
void load_affine(const std::optional<at::Tensor>& t, int64_t D, acc_t fill, std::vector<acc_t>& v) {
  v.assign(D, fill);
  if (t.has_value()) load_row(t->contiguous(), 0, D, v.data());
}

template <typename acc_t>
void fwd_cpu(const ForwardProblem& p) {
  const at::Tensor& x = *p.x;
  const Operand &shift = *p.shift, &scale = *p.scale;
  const auto &weight = *p.weight, &bias = *p.bias;
  at::Tensor &y = *p.y, &mean = *p.mean, &rstd = *p.rstd;
  const double eps = p.eps;
  const bool gated = p.h != nullptr;
  const bool rms = p.rms;
  const int64_t D = x.size(-1);
  const int64_t rows = x.numel() / D;
  std::vector<acc_t> w, b;
  load_affine(weight, D, acc_t(1), w);
  load_affine(bias, D, acc_t(0), b);
  acc_t* mean_p = rms ? nullptr : mean.mutable_data_ptr<acc_t>();
  acc_t* rstd_p = rstd.mutable_data_ptr<acc_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / D);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> v(D), a(D), c(D);
    for (int64_t r = begin; r < end; ++r) {
      if (gated) {
        load_row(x, r * D, D, v.data());
        load_row(*p.h, r * D, D, a.data());
        load_row(p.gate->tensor, row_offset(p.gate->map, r), D, c.data());
        for (int64_t i = 0; i < D; ++i) v[i] += c[i] * a[i];
        // Normalize the rounded r that is returned and saved, so backward sees the same input.
        store_row(*p.r, r * D, D, v.data());
        load_row(*p.r, r * D, D, v.data());
      } else {
        load_row(x, r * D, D, v.data());
      }
      acc_t sum = 0;
      if (!rms) {
        for (int64_t i = 0; i < D; ++i) sum += v[i];
      }
      const acc_t mu = sum / D;  // RMSNorm: 0
      acc_t sq = 0;
      for (int64_t i = 0; i < D; ++i) sq += (v[i] - mu) * (v[i] - mu);
      const acc_t rs = acc_t(1) / std::sqrt(sq / D + static_cast<acc_t>(eps));
      load_row(shift.tensor, row_offset(shift.map, r), D, a.data());
      load_row(scale.tensor, row_offset(scale.map, r), D, c.data());
      for (int64_t i = 0; i < D; ++i) {
        v[i] = (((v[i] - mu) * rs) * w[i] + b[i]) * (acc_t(1) + c[i]) + a[i];
      }
      store_row(y, r * D, D, v.data());
      if (!rms) mean_p[r] = mu;
      rstd_p[r] = rs;
    }
  });
}

template <typename acc_t>
void bwd_cpu(const BackwardProblem& p) {
  const at::Tensor &dy = *p.dy, &x = *p.x;
  const Operand& scale = *p.scale;
  const auto &weight = *p.weight, &bias = *p.bias;
  const at::Tensor &mean = *p.mean, &rstd = *p.rstd;
  at::Tensor& dx = *p.dx;
  GradTarget &dshift = *p.targets[kTargetShift], &dscale = *p.targets[kTargetScale];
  GradTarget &dweight = *p.targets[kTargetWeight], &dbias = *p.targets[kTargetBias];
  const bool gated = p.h != nullptr;
  const int64_t D = x.size(-1);
  const int64_t rows = x.numel() / D;
  GradTarget& dgate = *p.targets[kTargetGate];
  GradTarget* const* targets = p.targets;
  const int64_t gmin = min_group({&dshift, &dscale, &dgate, &dweight, &dbias}, rows);
  // Fixed chunking (independent of the thread count) keeps the reduction order, and so the
  // result, the same on every run and machine.
  const int64_t chunk = std::min(gmin, std::max<int64_t>(1, 65536 / D));
  const int64_t per_group = (gmin + chunk - 1) / chunk;
  const int64_t nchunks = (rows / gmin) * per_group;
  int slot[5];
  int nslots = 0;
  for (int q = 0; q < 5; ++q) slot[q] = targets[q]->mode == GradMode::kGrouped ? nslots++ : -1;
  std::vector<acc_t> partials(static_cast<size_t>(nchunks) * nslots * D, acc_t(0));
  std::vector<acc_t> w, b;
  load_affine(weight, D, acc_t(1), w);
  load_affine(bias, D, acc_t(0), b);
  const bool rms = p.rms;
  const acc_t* mean_p = rms ? nullptr : mean.const_data_ptr<acc_t>();
  const acc_t* rstd_p = rstd.const_data_ptr<acc_t>();
  const bool want_dx = dx.numel() > 0;
  const bool want_dh = gated && p.dh->numel() > 0;

  at::parallel_for(0, nchunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> xv(D), g(D), dyv(D), s1(D), t(D), e(D);
    for (int64_t ch = begin; ch < end; ++ch) {
      const int64_t first = (ch / per_group) * gmin + (ch % per_group) * chunk;
      const int64_t last = std::min(first + chunk, (ch / per_group + 1) * gmin);
      acc_t* part = partials.data() + ch * nslots * D;
      for (int64_t r = first; r < last; ++r) {
        load_row(x, r * D, D, xv.data());
        load_row(dy, r * D, D, dyv.data());
        load_row(scale.tensor, row_offset(scale.map, r), D, s1.data());
        const acc_t mu = rms ? acc_t(0) : mean_p[r], rs = rstd_p[r];
        acc_t sg = 0, sgx = 0;
        for (int64_t i = 0; i < D; ++i) {
          s1[i] += acc_t(1);
          xv[i] = (xv[i] - mu) * rs;  // xhat
          g[i] = dyv[i] * s1[i] * w[i];
          sg += g[i];
          sgx += g[i] * xv[i];
        }
        sg = rms ? acc_t(0) : sg / D;  // RMSNorm: no mean(g) term
        sgx /= D;
        for (int64_t i = 0; i < D; ++i) g[i] = rs * (g[i] - sg - xv[i] * sgx);  // dx
        if (gated) {
          if (p.dr->defined()) {
            load_row(*p.dr, r * D, D, t.data());
            for (int64_t i = 0; i < D; ++i) g[i] += t[i];
          }
          if (dgate.mode != GradMode::kNone) {
            load_row(*p.h, r * D, D, t.data());
            for (int64_t i = 0; i < D; ++i) t[i] *= g[i];  // dgate contribution
            if (dgate.mode == GradMode::kGrouped) {
              acc_t* p = part + slot[2] * D;
              for (int64_t i = 0; i < D; ++i) p[i] += t[i];
            } else {
              store_row(dgate.buf, r * D, D, t.data());
            }
          }
          if (want_dh) {
            load_row(p.gate->tensor, row_offset(p.gate->map, r), D, t.data());
            for (int64_t i = 0; i < D; ++i) t[i] *= g[i];
            store_row(*p.dh, r * D, D, t.data());
          }
        }
        if (want_dx) store_row(dx, r * D, D, g.data());
        for (int q : {0, 1, 3, 4}) {
          GradTarget& tg = *targets[q];
          if (tg.mode == GradMode::kNone) continue;
          for (int64_t i = 0; i < D; ++i) {
            switch (q) {
              case 0:
                e[i] = dyv[i];
                break;
              case 1:
                e[i] = dyv[i] * (xv[i] * w[i] + b[i]);
                break;
              case 3:
                e[i] = dyv[i] * s1[i] * xv[i];
                break;
              default:
                e[i] = dyv[i] * s1[i];
                break;
            }
          }
          if (tg.mode == GradMode::kGrouped) {
            acc_t* p = part + slot[q] * D;
            for (int64_t i = 0; i < D; ++i) p[i] += e[i];
          } else {
            store_row(tg.buf, r * D, D, e.data());
          }
        }
      }
    }
  });

  // Second stage: sum each group's chunk partials in chunk order.
  for (int q = 0; q < 5; ++q) {
    GradTarget& tg = *targets[q];
    if (tg.mode != GradMode::kGrouped) continue;
    const int64_t chunks_per_out = (tg.group / gmin) * per_group;
    const int64_t nout = rows / tg.group;
    at::parallel_for(0, nout, 1, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> acc(D);
      for (int64_t j = begin; j < end; ++j) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t ch = j * chunks_per_out; ch < (j + 1) * chunks_per_out; ++ch) {
          const acc_t* p = partials.data() + (ch * nslots + slot[q]) * D;
          for (int64_t i = 0; i < D; ++i) acc[i] += p[i];
        }
        store_row(tg.out, j * D, D, acc.data());
      }
    });
  }
}

}  // namespace

void norm_modulate_fwd_cpu(const ForwardProblem& p, const std::string*) {
  if (p.x->scalar_type() == at::kDouble) {
    fwd_cpu<double>(p);
  } else {
    fwd_cpu<float>(p);
  }
}

void norm_modulate_bwd_cpu(const BackwardProblem& p, const std::string*) {
  if (p.x->scalar_type() == at::kDouble) {
    bwd_cpu<double>(p);
  } else {
    bwd_cpu<float>(p);
  }
}

}  // namespace adaptiveload
