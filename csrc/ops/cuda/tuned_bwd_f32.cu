// The backward tuning table for f32 x: one line per row, first match wins (dispatch.cu). Each
// row's kernel is instantiated here and nowhere else. See configs.h for the columns and
// docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py prints
// candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
constexpr BwdRow kRows[] = {
// id, arch, norm, dy kind, op, affine, lean case, vector path, D min, D max, kernel, {teams, stages, interleave} (0: the rule)
{"bwd.f32.loop", 0, Norm::kLayer, -1, kEither, kEither, false, false, 1, kNoLimit, bwd_loop<float, Norm::kLayer>("loop<f32>"), {0, 0, true}},
{"bwd.f32.dybf16.lean2", 0, Norm::kLayer, kBF16, 0, 0, true, true, 4, 1024, bwd_lean<float, 2, kBF16, Norm::kLayer>("lean<f32,2,dybf16>"), {0, 0, true}},
{"bwd.f32.dybf16.lean4", 0, Norm::kLayer, kBF16, 0, 0, true, true, 1028, 8192, bwd_lean<float, 4, kBF16, Norm::kLayer>("lean<f32,4,dybf16>"), {0, 0, true}},
{"bwd.f32.dybf16.plain.vec1", 0, Norm::kLayer, kBF16, 0, 0, false, true, 4, 512, bwd_general<float, 1, kBF16, false, false, Norm::kLayer>("vector<f32,1,dybf16,plain>"), {0, 0, true}},
{"bwd.f32.dybf16.plain.vec2", 0, Norm::kLayer, kBF16, 0, 0, false, true, 516, 4096, bwd_general<float, 2, kBF16, false, false, Norm::kLayer>("vector<f32,2,dybf16,plain>"), {0, 0, true}},
{"bwd.f32.dybf16.plain.vec4", 0, Norm::kLayer, kBF16, 0, 0, false, true, 4100, 8192, bwd_general<float, 4, kBF16, false, false, Norm::kLayer>("vector<f32,4,dybf16,plain>"), {0, 0, true}},
{"bwd.f32.dybf16.plain.affine.vec1", 0, Norm::kLayer, kBF16, 0, 1, false, true, 4, 512, bwd_general<float, 1, kBF16, false, true, Norm::kLayer>("vector<f32,1,dybf16,plain.affine>"), {0, 0, true}},
{"bwd.f32.dybf16.plain.affine.vec2", 0, Norm::kLayer, kBF16, 0, 1, false, true, 516, 4096, bwd_general<float, 2, kBF16, false, true, Norm::kLayer>("vector<f32,2,dybf16,plain.affine>"), {0, 0, true}},
{"bwd.f32.dybf16.plain.affine.vec4", 0, Norm::kLayer, kBF16, 0, 1, false, true, 4100, 8192, bwd_general<float, 4, kBF16, false, true, Norm::kLayer>("vector<f32,4,dybf16,plain.affine>"), {0, 0, true}},
{"bwd.f32.dybf16.gated.vec1", 0, Norm::kLayer, kBF16, 1, 0, false, true, 4, 512, bwd_general<float, 1, kBF16, true, false, Norm::kLayer>("vector<f32,1,dybf16,gated>"), {0, 0, true}},
{"bwd.f32.dybf16.gated.vec2", 0, Norm::kLayer, kBF16, 1, 0, false, true, 516, 4096, bwd_general<float, 2, kBF16, true, false, Norm::kLayer>("vector<f32,2,dybf16,gated>"), {0, 0, true}},
{"bwd.f32.dybf16.gated.vec4", 0, Norm::kLayer, kBF16, 1, 0, false, true, 4100, 8192, bwd_general<float, 4, kBF16, true, false, Norm::kLayer>("vector<f32,4,dybf16,gated>"), {0, 0, true}},
{"bwd.f32.dybf16.gated.affine.vec1", 0, Norm::kLayer, kBF16, 1, 1, false, true, 4, 512, bwd_general<float, 1, kBF16, true, true, Norm::kLayer>("vector<f32,1,dybf16,gated.affine>"), {0, 0, true}},
{"bwd.f32.dybf16.gated.affine.vec2", 0, Norm::kLayer, kBF16, 1, 1, false, true, 516, 4096, bwd_general<float, 2, kBF16, true, true, Norm::kLayer>("vector<f32,2,dybf16,gated.affine>"), {0, 0, true}},
{"bwd.f32.dybf16.gated.affine.vec4", 0, Norm::kLayer, kBF16, 1, 1, false, true, 4100, 8192, bwd_general<float, 4, kBF16, true, true, Norm::kLayer>("vector<f32,4,dybf16,gated.affine>"), {0, 0, true}},
{"bwd.f32.dy32.lean2", 0, Norm::kLayer, kF32, 0, 0, true, true, 4, 1024, bwd_lean<float, 2, kF32, Norm::kLayer>("lean<f32,2,dy32>"), {0, 0, true}},
{"bwd.f32.dy32.lean4", 0, Norm::kLayer, kF32, 0, 0, true, true, 1028, 8192, bwd_lean<float, 4, kF32, Norm::kLayer>("lean<f32,4,dy32>"), {0, 0, true}},
{"bwd.f32.dy32.plain.vec1", 0, Norm::kLayer, kF32, 0, 0, false, true, 4, 512, bwd_general<float, 1, kF32, false, false, Norm::kLayer>("vector<f32,1,dy32,plain>"), {0, 0, true}},
{"bwd.f32.dy32.plain.vec2", 0, Norm::kLayer, kF32, 0, 0, false, true, 516, 4096, bwd_general<float, 2, kF32, false, false, Norm::kLayer>("vector<f32,2,dy32,plain>"), {0, 0, true}},
{"bwd.f32.dy32.plain.vec4", 0, Norm::kLayer, kF32, 0, 0, false, true, 4100, 8192, bwd_general<float, 4, kF32, false, false, Norm::kLayer>("vector<f32,4,dy32,plain>"), {0, 0, true}},
{"bwd.f32.dy32.plain.affine.vec1", 0, Norm::kLayer, kF32, 0, 1, false, true, 4, 512, bwd_general<float, 1, kF32, false, true, Norm::kLayer>("vector<f32,1,dy32,plain.affine>"), {0, 0, true}},
{"bwd.f32.dy32.plain.affine.vec2", 0, Norm::kLayer, kF32, 0, 1, false, true, 516, 4096, bwd_general<float, 2, kF32, false, true, Norm::kLayer>("vector<f32,2,dy32,plain.affine>"), {0, 0, true}},
{"bwd.f32.dy32.plain.affine.vec4", 0, Norm::kLayer, kF32, 0, 1, false, true, 4100, 8192, bwd_general<float, 4, kF32, false, true, Norm::kLayer>("vector<f32,4,dy32,plain.affine>"), {0, 0, true}},
{"bwd.f32.dy32.gated.vec1", 0, Norm::kLayer, kF32, 1, 0, false, true, 4, 512, bwd_general<float, 1, kF32, true, false, Norm::kLayer>("vector<f32,1,dy32,gated>"), {0, 0, true}},
{"bwd.f32.dy32.gated.vec2", 0, Norm::kLayer, kF32, 1, 0, false, true, 516, 4096, bwd_general<float, 2, kF32, true, false, Norm::kLayer>("vector<f32,2,dy32,gated>"), {0, 0, true}},
{"bwd.f32.dy32.gated.vec4", 0, Norm::kLayer, kF32, 1, 0, false, true, 4100, 8192, bwd_general<float, 4, kF32, true, false, Norm::kLayer>("vector<f32,4,dy32,gated>"), {0, 0, true}},
{"bwd.f32.dy32.gated.affine.vec1", 0, Norm::kLayer, kF32, 1, 1, false, true, 4, 512, bwd_general<float, 1, kF32, true, true, Norm::kLayer>("vector<f32,1,dy32,gated.affine>"), {0, 0, true}},
{"bwd.f32.dy32.gated.affine.vec2", 0, Norm::kLayer, kF32, 1, 1, false, true, 516, 4096, bwd_general<float, 2, kF32, true, true, Norm::kLayer>("vector<f32,2,dy32,gated.affine>"), {0, 0, true}},
{"bwd.f32.dy32.gated.affine.vec4", 0, Norm::kLayer, kF32, 1, 1, false, true, 4100, 8192, bwd_general<float, 4, kF32, true, true, Norm::kLayer>("vector<f32,4,dy32,gated.affine>"), {0, 0, true}},
// RMSNorm (Norm::kRms): the LayerNorm rows' settings, not tuned separately (docs/ops.md)
{"bwd.f32.rms.loop", 0, Norm::kRms, -1, kEither, kEither, false, false, 1, kNoLimit, bwd_loop<float, Norm::kRms>("loop<f32,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.lean2", 0, Norm::kRms, kBF16, 0, 0, true, true, 4, 1024, bwd_lean<float, 2, kBF16, Norm::kRms>("lean<f32,2,dybf16,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.lean4", 0, Norm::kRms, kBF16, 0, 0, true, true, 1028, 8192, bwd_lean<float, 4, kBF16, Norm::kRms>("lean<f32,4,dybf16,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.plain.vec1", 0, Norm::kRms, kBF16, 0, 0, false, true, 4, 512, bwd_general<float, 1, kBF16, false, false, Norm::kRms>("vector<f32,1,dybf16,plain,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.plain.vec2", 0, Norm::kRms, kBF16, 0, 0, false, true, 516, 4096, bwd_general<float, 2, kBF16, false, false, Norm::kRms>("vector<f32,2,dybf16,plain,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.plain.vec4", 0, Norm::kRms, kBF16, 0, 0, false, true, 4100, 8192, bwd_general<float, 4, kBF16, false, false, Norm::kRms>("vector<f32,4,dybf16,plain,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.plain.affine.vec1", 0, Norm::kRms, kBF16, 0, 1, false, true, 4, 512, bwd_general<float, 1, kBF16, false, true, Norm::kRms>("vector<f32,1,dybf16,plain.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.plain.affine.vec2", 0, Norm::kRms, kBF16, 0, 1, false, true, 516, 4096, bwd_general<float, 2, kBF16, false, true, Norm::kRms>("vector<f32,2,dybf16,plain.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.plain.affine.vec4", 0, Norm::kRms, kBF16, 0, 1, false, true, 4100, 8192, bwd_general<float, 4, kBF16, false, true, Norm::kRms>("vector<f32,4,dybf16,plain.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.gated.vec1", 0, Norm::kRms, kBF16, 1, 0, false, true, 4, 512, bwd_general<float, 1, kBF16, true, false, Norm::kRms>("vector<f32,1,dybf16,gated,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.gated.vec2", 0, Norm::kRms, kBF16, 1, 0, false, true, 516, 4096, bwd_general<float, 2, kBF16, true, false, Norm::kRms>("vector<f32,2,dybf16,gated,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.gated.vec4", 0, Norm::kRms, kBF16, 1, 0, false, true, 4100, 8192, bwd_general<float, 4, kBF16, true, false, Norm::kRms>("vector<f32,4,dybf16,gated,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.gated.affine.vec1", 0, Norm::kRms, kBF16, 1, 1, false, true, 4, 512, bwd_general<float, 1, kBF16, true, true, Norm::kRms>("vector<f32,1,dybf16,gated.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.gated.affine.vec2", 0, Norm::kRms, kBF16, 1, 1, false, true, 516, 4096, bwd_general<float, 2, kBF16, true, true, Norm::kRms>("vector<f32,2,dybf16,gated.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dybf16.gated.affine.vec4", 0, Norm::kRms, kBF16, 1, 1, false, true, 4100, 8192, bwd_general<float, 4, kBF16, true, true, Norm::kRms>("vector<f32,4,dybf16,gated.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.lean2", 0, Norm::kRms, kF32, 0, 0, true, true, 4, 1024, bwd_lean<float, 2, kF32, Norm::kRms>("lean<f32,2,dy32,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.lean4", 0, Norm::kRms, kF32, 0, 0, true, true, 1028, 8192, bwd_lean<float, 4, kF32, Norm::kRms>("lean<f32,4,dy32,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.plain.vec1", 0, Norm::kRms, kF32, 0, 0, false, true, 4, 512, bwd_general<float, 1, kF32, false, false, Norm::kRms>("vector<f32,1,dy32,plain,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.plain.vec2", 0, Norm::kRms, kF32, 0, 0, false, true, 516, 4096, bwd_general<float, 2, kF32, false, false, Norm::kRms>("vector<f32,2,dy32,plain,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.plain.vec4", 0, Norm::kRms, kF32, 0, 0, false, true, 4100, 8192, bwd_general<float, 4, kF32, false, false, Norm::kRms>("vector<f32,4,dy32,plain,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.plain.affine.vec1", 0, Norm::kRms, kF32, 0, 1, false, true, 4, 512, bwd_general<float, 1, kF32, false, true, Norm::kRms>("vector<f32,1,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.plain.affine.vec2", 0, Norm::kRms, kF32, 0, 1, false, true, 516, 4096, bwd_general<float, 2, kF32, false, true, Norm::kRms>("vector<f32,2,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.plain.affine.vec4", 0, Norm::kRms, kF32, 0, 1, false, true, 4100, 8192, bwd_general<float, 4, kF32, false, true, Norm::kRms>("vector<f32,4,dy32,plain.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.gated.vec1", 0, Norm::kRms, kF32, 1, 0, false, true, 4, 512, bwd_general<float, 1, kF32, true, false, Norm::kRms>("vector<f32,1,dy32,gated,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.gated.vec2", 0, Norm::kRms, kF32, 1, 0, false, true, 516, 4096, bwd_general<float, 2, kF32, true, false, Norm::kRms>("vector<f32,2,dy32,gated,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.gated.vec4", 0, Norm::kRms, kF32, 1, 0, false, true, 4100, 8192, bwd_general<float, 4, kF32, true, false, Norm::kRms>("vector<f32,4,dy32,gated,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.gated.affine.vec1", 0, Norm::kRms, kF32, 1, 1, false, true, 4, 512, bwd_general<float, 1, kF32, true, true, Norm::kRms>("vector<f32,1,dy32,gated.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.gated.affine.vec2", 0, Norm::kRms, kF32, 1, 1, false, true, 516, 4096, bwd_general<float, 2, kF32, true, true, Norm::kRms>("vector<f32,2,dy32,gated.affine,rms>"), {0, 0, true}},
{"bwd.f32.rms.dy32.gated.affine.vec4", 0, Norm::kRms, kF32, 1, 1, false, true, 4100, 8192, bwd_general<float, 4, kF32, true, true, Norm::kRms>("vector<f32,4,dy32,gated.affine,rms>"), {0, 0, true}},
};
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<BwdRow> kBwdTableF32 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
