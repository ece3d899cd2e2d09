// The backward tuning table for f16 x: one line per row, first match wins (dispatch.cu). Each
// row's kernel is instantiated here and nowhere else. See configs.h for the columns and
// docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py prints
// candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
constexpr BwdRow kRows[] = {
// id, arch, norm, dy kind, op, affine, lean case, vector path, D min, D max, kernel, {teams, stages, interleave} (0: the rule)
{"bwd.f16.loop", 0, Norm::kLayer, -1, kEither, kEither, false, false, 1, kNoLimit, bwd_loop<c10::Half, Norm::kLayer>("loop<f16>"), {0, 0, true}},
{"bwd.f16.dy16.lean1", 0, Norm::kLayer, kF16, 0, 0, true, true, 8, 1024, bwd_lean<c10::Half, 1, kF16, Norm::kLayer>("lean<f16,1,dy16>"), {0, 0, true}},
{"bwd.f16.dy16.lean2", 0, Norm::kLayer, kF16, 0, 0, true, true, 1032, 8192, bwd_lean<c10::Half, 2, kF16, Norm::kLayer>("lean<f16,2,dy16>"), {0, 0, true}},
{"bwd.f16.dy16.token2", 0, Norm::kLayer, kF16, 0, 0, false, true, 8, 4096, bwd_token<c10::Half, 2, kF16, Norm::kLayer>("token<f16,2,dy16>"), {0, 0, true}},
{"bwd.f16.dy16.plain.vec1", 0, Norm::kLayer, kF16, 0, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, false, false, Norm::kLayer>("vector<f16,1,dy16,plain>"), {0, 0, true}},
{"bwd.f16.dy16.plain.vec2", 0, Norm::kLayer, kF16, 0, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, false, false, Norm::kLayer>("vector<f16,2,dy16,plain>"), {0, 0, true}},
{"bwd.f16.dy16.plain.vec4", 0, Norm::kLayer, kF16, 0, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, false, false, Norm::kLayer>("vector<f16,4,dy16,plain>"), {0, 0, true}},
{"bwd.f16.dy16.plain.affine.vec1", 0, Norm::kLayer, kF16, 0, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, false, true, Norm::kLayer>("vector<f16,1,dy16,plain.affine>"), {0, 0, true}},
{"bwd.f16.dy16.plain.affine.vec2", 0, Norm::kLayer, kF16, 0, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, false, true, Norm::kLayer>("vector<f16,2,dy16,plain.affine>"), {0, 0, true}},
{"bwd.f16.dy16.plain.affine.vec4", 0, Norm::kLayer, kF16, 0, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, false, true, Norm::kLayer>("vector<f16,4,dy16,plain.affine>"), {0, 0, true}},
{"bwd.f16.dy16.gated.vec1", 0, Norm::kLayer, kF16, 1, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, true, false, Norm::kLayer>("vector<f16,1,dy16,gated>"), {0, 0, true}},
{"bwd.f16.dy16.gated.vec2", 0, Norm::kLayer, kF16, 1, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, true, false, Norm::kLayer>("vector<f16,2,dy16,gated>"), {0, 0, true}},
{"bwd.f16.dy16.gated.vec4", 0, Norm::kLayer, kF16, 1, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, true, false, Norm::kLayer>("vector<f16,4,dy16,gated>"), {0, 0, true}},
{"bwd.f16.dy16.gated.affine.vec1", 0, Norm::kLayer, kF16, 1, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, true, true, Norm::kLayer>("vector<f16,1,dy16,gated.affine>"), {0, 0, true}},
{"bwd.f16.dy16.gated.affine.vec2", 0, Norm::kLayer, kF16, 1, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, true, true, Norm::kLayer>("vector<f16,2,dy16,gated.affine>"), {0, 0, true}},
{"bwd.f16.dy16.gated.affine.vec4", 0, Norm::kLayer, kF16, 1, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, true, true, Norm::kLayer>("vector<f16,4,dy16,gated.affine>"), {0, 0, true}},
{"bwd.f16.dy32.lean1", 0, Norm::kLayer, kF32, 0, 0, true, true, 8, 1024, bwd_lean<c10::Half, 1, kF32, Norm::kLayer>("lean<f16,1,dy32>"), {0, 0, true}},
{"bwd.f16.dy32.lean2", 0, Norm::kLayer, kF32, 0, 0, true, true, 1032, 8192, bwd_lean<c10::Half, 2, kF32, Norm::kLayer>("lean<f16,2,dy32>"), {0, 0, true}},
{"bwd.f16.dy32.token2", 0, Norm::kLayer, kF32, 0, 0, false, true, 8, 4096, bwd_token<c10::Half, 2, kF32, Norm::kLayer>("token<f16,2,dy32>"), {0, 0, true}},
{"bwd.f16.dy32.plain.vec1", 0, Norm::kLayer, kF32, 0, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, false, false, Norm::kLayer>("vector<f16,1,dy32,plain>"), {0, 0, true}},
{"bwd.f16.dy32.plain.vec2", 0, Norm::kLayer, kF32, 0, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, false, false, Norm::kLayer>("vector<f16,2,dy32,plain>"), {0, 0, true}},
{"bwd.f16.dy32.plain.vec4", 0, Norm::kLayer, kF32, 0, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, false, false, Norm::kLayer>("vector<f16,4,dy32,plain>"), {0, 0, true}},
{"bwd.f16.dy32.plain.affine.vec1", 0, Norm::kLayer, kF32, 0, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, false, true, Norm::kLayer>("vector<f16,1,dy32,plain.affine>"), {0, 0, true}},
{"bwd.f16.dy32.plain.affine.vec2", 0, Norm::kLayer, kF32, 0, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, false, true, Norm::kLayer>("vector<f16,2,dy32,plain.affine>"), {0, 0, true}},
{"bwd.f16.dy32.plain.affine.vec4", 0, Norm::kLayer, kF32, 0, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, false, true, Norm::kLayer>("vector<f16,4,dy32,plain.affine>"), {0, 0, true}},
{"bwd.f16.dy32.gated.vec1", 0, Norm::kLayer, kF32, 1, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, true, false, Norm::kLayer>("vector<f16,1,dy32,gated>"), {0, 0, true}},
{"bwd.f16.dy32.gated.vec2", 0, Norm::kLayer, kF32, 1, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, true, false, Norm::kLayer>("vector<f16,2,dy32,gated>"), {0, 0, true}},
{"bwd.f16.dy32.gated.vec4", 0, Norm::kLayer, kF32, 1, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, true, false, Norm::kLayer>("vector<f16,4,dy32,gated>"), {0, 0, true}},
{"bwd.f16.dy32.gated.affine.vec1", 0, Norm::kLayer, kF32, 1, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, true, true, Norm::kLayer>("vector<f16,1,dy32,gated.affine>"), {0, 0, true}},
{"bwd.f16.dy32.gated.affine.vec2", 0, Norm::kLayer, kF32, 1, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, true, true, Norm::kLayer>("vector<f16,2,dy32,gated.affine>"), {0, 0, true}},
{"bwd.f16.dy32.gated.affine.vec4", 0, Norm::kLayer, kF32, 1, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, true, true, Norm::kLayer>("vector<f16,4,dy32,gated.affine>"), {0, 0, true}},
// RMSNorm (Norm::kRms): the LayerNorm rows' settings, not tuned separately (docs/ops.md)
{"bwd.f16.rms.loop", 0, Norm::kRms, -1, kEither, kEither, false, false, 1, kNoLimit, bwd_loop<c10::Half, Norm::kRms>("loop<f16,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.lean1", 0, Norm::kRms, kF16, 0, 0, true, true, 8, 1024, bwd_lean<c10::Half, 1, kF16, Norm::kRms>("lean<f16,1,dy16,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.lean2", 0, Norm::kRms, kF16, 0, 0, true, true, 1032, 8192, bwd_lean<c10::Half, 2, kF16, Norm::kRms>("lean<f16,2,dy16,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.token2", 0, Norm::kRms, kF16, 0, 0, false, true, 8, 4096, bwd_token<c10::Half, 2, kF16, Norm::kRms>("token<f16,2,dy16,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.plain.vec1", 0, Norm::kRms, kF16, 0, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, false, false, Norm::kRms>("vector<f16,1,dy16,plain,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.plain.vec2", 0, Norm::kRms, kF16, 0, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, false, false, Norm::kRms>("vector<f16,2,dy16,plain,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.plain.vec4", 0, Norm::kRms, kF16, 0, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, false, false, Norm::kRms>("vector<f16,4,dy16,plain,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.plain.affine.vec1", 0, Norm::kRms, kF16, 0, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, false, true, Norm::kRms>("vector<f16,1,dy16,plain.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.plain.affine.vec2", 0, Norm::kRms, kF16, 0, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, false, true, Norm::kRms>("vector<f16,2,dy16,plain.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.plain.affine.vec4", 0, Norm::kRms, kF16, 0, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, false, true, Norm::kRms>("vector<f16,4,dy16,plain.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.gated.vec1", 0, Norm::kRms, kF16, 1, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, true, false, Norm::kRms>("vector<f16,1,dy16,gated,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.gated.vec2", 0, Norm::kRms, kF16, 1, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, true, false, Norm::kRms>("vector<f16,2,dy16,gated,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.gated.vec4", 0, Norm::kRms, kF16, 1, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, true, false, Norm::kRms>("vector<f16,4,dy16,gated,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.gated.affine.vec1", 0, Norm::kRms, kF16, 1, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF16, true, true, Norm::kRms>("vector<f16,1,dy16,gated.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.gated.affine.vec2", 0, Norm::kRms, kF16, 1, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF16, true, true, Norm::kRms>("vector<f16,2,dy16,gated.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy16.gated.affine.vec4", 0, Norm::kRms, kF16, 1, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF16, true, true, Norm::kRms>("vector<f16,4,dy16,gated.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.lean1", 0, Norm::kRms, kF32, 0, 0, true, true, 8, 1024, bwd_lean<c10::Half, 1, kF32, Norm::kRms>("lean<f16,1,dy32,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.lean2", 0, Norm::kRms, kF32, 0, 0, true, true, 1032, 8192, bwd_lean<c10::Half, 2, kF32, Norm::kRms>("lean<f16,2,dy32,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.token2", 0, Norm::kRms, kF32, 0, 0, false, true, 8, 4096, bwd_token<c10::Half, 2, kF32, Norm::kRms>("token<f16,2,dy32,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.plain.vec1", 0, Norm::kRms, kF32, 0, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, false, false, Norm::kRms>("vector<f16,1,dy32,plain,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.plain.vec2", 0, Norm::kRms, kF32, 0, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, false, false, Norm::kRms>("vector<f16,2,dy32,plain,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.plain.vec4", 0, Norm::kRms, kF32, 0, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, false, false, Norm::kRms>("vector<f16,4,dy32,plain,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.plain.affine.vec1", 0, Norm::kRms, kF32, 0, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, false, true, Norm::kRms>("vector<f16,1,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.plain.affine.vec2", 0, Norm::kRms, kF32, 0, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, false, true, Norm::kRms>("vector<f16,2,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.plain.affine.vec4", 0, Norm::kRms, kF32, 0, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, false, true, Norm::kRms>("vector<f16,4,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.gated.vec1", 0, Norm::kRms, kF32, 1, 0, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, true, false, Norm::kRms>("vector<f16,1,dy32,gated,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.gated.vec2", 0, Norm::kRms, kF32, 1, 0, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, true, false, Norm::kRms>("vector<f16,2,dy32,gated,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.gated.vec4", 0, Norm::kRms, kF32, 1, 0, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, true, false, Norm::kRms>("vector<f16,4,dy32,gated,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.gated.affine.vec1", 0, Norm::kRms, kF32, 1, 1, false, true, 8, 1024, bwd_general<c10::Half, 1, kF32, true, true, Norm::kRms>("vector<f16,1,dy32,gated.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.gated.affine.vec2", 0, Norm::kRms, kF32, 1, 1, false, true, 1032, 8192, bwd_general<c10::Half, 2, kF32, true, true, Norm::kRms>("vector<f16,2,dy32,gated.affine,rms>"), {0, 0, true}},
{"bwd.f16.rms.dy32.gated.affine.vec4", 0, Norm::kRms, kF32, 1, 1, false, true, 8200, 16384, bwd_general<c10::Half, 4, kF32, true, true, Norm::kRms>("vector<f16,4,dy32,gated.affine,rms>"), {0, 0, true}},
};
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<BwdRow> kBwdTableF16 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
