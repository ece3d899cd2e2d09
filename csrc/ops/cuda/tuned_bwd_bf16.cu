// The backward tuning table for bf16 x: one line per row, first match wins (dispatch.cu). Each
// row's kernel is instantiated here and nowhere else. See configs.h for the columns and
// docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py prints
// candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
constexpr BwdRow kRows[] = {
// id, arch, norm, dy kind, op, affine, lean case, vector path, D min, D max, kernel, {teams, stages, interleave} (0: the rule)
{"bwd.bf16.loop", 0, Norm::kLayer, -1, kEither, kEither, false, false, 1, kNoLimit, bwd_loop<c10::BFloat16, Norm::kLayer>("loop<bf16>"), {0, 0, true}},
{"bwd.bf16.dy16.lean1", 0, Norm::kLayer, kBF16, 0, 0, true, true, 8, 1024, bwd_lean<c10::BFloat16, 1, kBF16, Norm::kLayer>("lean<bf16,1,dy16>"), {0, 0, true}},
{"bwd.bf16.dy16.lean2", 0, Norm::kLayer, kBF16, 0, 0, true, true, 1032, 8192, bwd_lean<c10::BFloat16, 2, kBF16, Norm::kLayer>("lean<bf16,2,dy16>"), {0, 0, true}},
{"bwd.bf16.dy16.token2", 0, Norm::kLayer, kBF16, 0, 0, false, true, 8, 4096, bwd_token<c10::BFloat16, 2, kBF16, Norm::kLayer>("token<bf16,2,dy16>"), {0, 0, true}},
{"bwd.bf16.dy16.plain.vec1", 0, Norm::kLayer, kBF16, 0, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, false, false, Norm::kLayer>("vector<bf16,1,dy16,plain>"), {0, 0, true}},
{"bwd.bf16.dy16.plain.vec2", 0, Norm::kLayer, kBF16, 0, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, false, false, Norm::kLayer>("vector<bf16,2,dy16,plain>"), {0, 0, true}},
{"bwd.bf16.dy16.plain.vec4", 0, Norm::kLayer, kBF16, 0, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, false, false, Norm::kLayer>("vector<bf16,4,dy16,plain>"), {0, 0, true}},
{"bwd.bf16.dy16.plain.affine.vec1", 0, Norm::kLayer, kBF16, 0, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, false, true, Norm::kLayer>("vector<bf16,1,dy16,plain.affine>"), {0, 0, true}},
{"bwd.bf16.dy16.plain.affine.vec2", 0, Norm::kLayer, kBF16, 0, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, false, true, Norm::kLayer>("vector<bf16,2,dy16,plain.affine>"), {0, 0, true}},
{"bwd.bf16.dy16.plain.affine.vec4", 0, Norm::kLayer, kBF16, 0, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, false, true, Norm::kLayer>("vector<bf16,4,dy16,plain.affine>"), {0, 0, true}},
{"bwd.bf16.dy16.gated.vec1", 0, Norm::kLayer, kBF16, 1, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, true, false, Norm::kLayer>("vector<bf16,1,dy16,gated>"), {0, 0, true}},
{"bwd.bf16.dy16.gated.vec2", 0, Norm::kLayer, kBF16, 1, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, true, false, Norm::kLayer>("vector<bf16,2,dy16,gated>"), {0, 0, true}},
{"bwd.bf16.dy16.gated.vec4", 0, Norm::kLayer, kBF16, 1, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, true, false, Norm::kLayer>("vector<bf16,4,dy16,gated>"), {0, 0, true}},
{"bwd.bf16.dy16.gated.affine.vec1", 0, Norm::kLayer, kBF16, 1, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, true, true, Norm::kLayer>("vector<bf16,1,dy16,gated.affine>"), {0, 0, true}},
{"bwd.bf16.dy16.gated.affine.vec2", 0, Norm::kLayer, kBF16, 1, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, true, true, Norm::kLayer>("vector<bf16,2,dy16,gated.affine>"), {0, 0, true}},
{"bwd.bf16.dy16.gated.affine.vec4", 0, Norm::kLayer, kBF16, 1, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, true, true, Norm::kLayer>("vector<bf16,4,dy16,gated.affine>"), {0, 0, true}},
{"bwd.bf16.dy32.lean1", 0, Norm::kLayer, kF32, 0, 0, true, true, 8, 1024, bwd_lean<c10::BFloat16, 1, kF32, Norm::kLayer>("lean<bf16,1,dy32>"), {0, 0, true}},
{"bwd.bf16.dy32.lean2", 0, Norm::kLayer, kF32, 0, 0, true, true, 1032, 8192, bwd_lean<c10::BFloat16, 2, kF32, Norm::kLayer>("lean<bf16,2,dy32>"), {0, 0, true}},
{"bwd.bf16.dy32.token2", 0, Norm::kLayer, kF32, 0, 0, false, true, 8, 4096, bwd_token<c10::BFloat16, 2, kF32, Norm::kLayer>("token<bf16,2,dy32>"), {0, 0, true}},
{"bwd.bf16.dy32.plain.vec1", 0, Norm::kLayer, kF32, 0, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, false, false, Norm::kLayer>("vector<bf16,1,dy32,plain>"), {0, 0, true}},
{"bwd.bf16.dy32.plain.vec2", 0, Norm::kLayer, kF32, 0, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, false, false, Norm::kLayer>("vector<bf16,2,dy32,plain>"), {0, 0, true}},
{"bwd.bf16.dy32.plain.vec4", 0, Norm::kLayer, kF32, 0, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, false, false, Norm::kLayer>("vector<bf16,4,dy32,plain>"), {0, 0, true}},
{"bwd.bf16.dy32.plain.affine.vec1", 0, Norm::kLayer, kF32, 0, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, false, true, Norm::kLayer>("vector<bf16,1,dy32,plain.affine>"), {0, 0, true}},
{"bwd.bf16.dy32.plain.affine.vec2", 0, Norm::kLayer, kF32, 0, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, false, true, Norm::kLayer>("vector<bf16,2,dy32,plain.affine>"), {0, 0, true}},
{"bwd.bf16.dy32.plain.affine.vec4", 0, Norm::kLayer, kF32, 0, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, false, true, Norm::kLayer>("vector<bf16,4,dy32,plain.affine>"), {0, 0, true}},
{"bwd.bf16.dy32.gated.vec1", 0, Norm::kLayer, kF32, 1, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, true, false, Norm::kLayer>("vector<bf16,1,dy32,gated>"), {0, 0, true}},
{"bwd.bf16.dy32.gated.vec2", 0, Norm::kLayer, kF32, 1, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, true, false, Norm::kLayer>("vector<bf16,2,dy32,gated>"), {0, 0, true}},
{"bwd.bf16.dy32.gated.vec4", 0, Norm::kLayer, kF32, 1, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, true, false, Norm::kLayer>("vector<bf16,4,dy32,gated>"), {0, 0, true}},
{"bwd.bf16.dy32.gated.affine.vec1", 0, Norm::kLayer, kF32, 1, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, true, true, Norm::kLayer>("vector<bf16,1,dy32,gated.affine>"), {0, 0, true}},
{"bwd.bf16.dy32.gated.affine.vec2", 0, Norm::kLayer, kF32, 1, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, true, true, Norm::kLayer>("vector<bf16,2,dy32,gated.affine>"), {0, 0, true}},
{"bwd.bf16.dy32.gated.affine.vec4", 0, Norm::kLayer, kF32, 1, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, true, true, Norm::kLayer>("vector<bf16,4,dy32,gated.affine>"), {0, 0, true}},
// RMSNorm (Norm::kRms): the LayerNorm rows' settings, not tuned separately (docs/ops.md)
{"bwd.bf16.rms.loop", 0, Norm::kRms, -1, kEither, kEither, false, false, 1, kNoLimit, bwd_loop<c10::BFloat16, Norm::kRms>("loop<bf16,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.lean1", 0, Norm::kRms, kBF16, 0, 0, true, true, 8, 1024, bwd_lean<c10::BFloat16, 1, kBF16, Norm::kRms>("lean<bf16,1,dy16,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.lean2", 0, Norm::kRms, kBF16, 0, 0, true, true, 1032, 8192, bwd_lean<c10::BFloat16, 2, kBF16, Norm::kRms>("lean<bf16,2,dy16,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.token2", 0, Norm::kRms, kBF16, 0, 0, false, true, 8, 4096, bwd_token<c10::BFloat16, 2, kBF16, Norm::kRms>("token<bf16,2,dy16,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.plain.vec1", 0, Norm::kRms, kBF16, 0, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, false, false, Norm::kRms>("vector<bf16,1,dy16,plain,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.plain.vec2", 0, Norm::kRms, kBF16, 0, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, false, false, Norm::kRms>("vector<bf16,2,dy16,plain,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.plain.vec4", 0, Norm::kRms, kBF16, 0, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, false, false, Norm::kRms>("vector<bf16,4,dy16,plain,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.plain.affine.vec1", 0, Norm::kRms, kBF16, 0, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, false, true, Norm::kRms>("vector<bf16,1,dy16,plain.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.plain.affine.vec2", 0, Norm::kRms, kBF16, 0, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, false, true, Norm::kRms>("vector<bf16,2,dy16,plain.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.plain.affine.vec4", 0, Norm::kRms, kBF16, 0, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, false, true, Norm::kRms>("vector<bf16,4,dy16,plain.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.gated.vec1", 0, Norm::kRms, kBF16, 1, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, true, false, Norm::kRms>("vector<bf16,1,dy16,gated,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.gated.vec2", 0, Norm::kRms, kBF16, 1, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, true, false, Norm::kRms>("vector<bf16,2,dy16,gated,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.gated.vec4", 0, Norm::kRms, kBF16, 1, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, true, false, Norm::kRms>("vector<bf16,4,dy16,gated,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.gated.affine.vec1", 0, Norm::kRms, kBF16, 1, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kBF16, true, true, Norm::kRms>("vector<bf16,1,dy16,gated.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.gated.affine.vec2", 0, Norm::kRms, kBF16, 1, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kBF16, true, true, Norm::kRms>("vector<bf16,2,dy16,gated.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy16.gated.affine.vec4", 0, Norm::kRms, kBF16, 1, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kBF16, true, true, Norm::kRms>("vector<bf16,4,dy16,gated.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.lean1", 0, Norm::kRms, kF32, 0, 0, true, true, 8, 1024, bwd_lean<c10::BFloat16, 1, kF32, Norm::kRms>("lean<bf16,1,dy32,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.lean2", 0, Norm::kRms, kF32, 0, 0, true, true, 1032, 8192, bwd_lean<c10::BFloat16, 2, kF32, Norm::kRms>("lean<bf16,2,dy32,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.token2", 0, Norm::kRms, kF32, 0, 0, false, true, 8, 4096, bwd_token<c10::BFloat16, 2, kF32, Norm::kRms>("token<bf16,2,dy32,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.plain.vec1", 0, Norm::kRms, kF32, 0, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, false, false, Norm::kRms>("vector<bf16,1,dy32,plain,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.plain.vec2", 0, Norm::kRms, kF32, 0, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, false, false, Norm::kRms>("vector<bf16,2,dy32,plain,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.plain.vec4", 0, Norm::kRms, kF32, 0, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, false, false, Norm::kRms>("vector<bf16,4,dy32,plain,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.plain.affine.vec1", 0, Norm::kRms, kF32, 0, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, false, true, Norm::kRms>("vector<bf16,1,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.plain.affine.vec2", 0, Norm::kRms, kF32, 0, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, false, true, Norm::kRms>("vector<bf16,2,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.plain.affine.vec4", 0, Norm::kRms, kF32, 0, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, false, true, Norm::kRms>("vector<bf16,4,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.gated.vec1", 0, Norm::kRms, kF32, 1, 0, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, true, false, Norm::kRms>("vector<bf16,1,dy32,gated,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.gated.vec2", 0, Norm::kRms, kF32, 1, 0, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, true, false, Norm::kRms>("vector<bf16,2,dy32,gated,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.gated.vec4", 0, Norm::kRms, kF32, 1, 0, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, true, false, Norm::kRms>("vector<bf16,4,dy32,gated,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.gated.affine.vec1", 0, Norm::kRms, kF32, 1, 1, false, true, 8, 1024, bwd_general<c10::BFloat16, 1, kF32, true, true, Norm::kRms>("vector<bf16,1,dy32,gated.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.gated.affine.vec2", 0, Norm::kRms, kF32, 1, 1, false, true, 1032, 8192, bwd_general<c10::BFloat16, 2, kF32, true, true, Norm::kRms>("vector<bf16,2,dy32,gated.affine,rms>"), {0, 0, true}},
{"bwd.bf16.rms.dy32.gated.affine.vec4", 0, Norm::kRms, kF32, 1, 1, false, true, 8200, 16384, bwd_general<c10::BFloat16, 4, kF32, true, true, Norm::kRms>("vector<bf16,4,dy32,gated.affine,rms>"), {0, 0, true}},
};
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<BwdRow> kBwdTableBF16 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
