// The backward tuning table for f32 x: first match wins (dispatch.cu). Each line is a
// LayerNorm row and its RMSNorm twin (configs.h: shared rows); no row is tuned for one norm
// alone today. Each row's kernel is instantiated here and nowhere else. See configs.h for the
// columns and docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py
// prints candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
// id (after TABLE_ID), arch, (dy kind, op, affine, lean case, vector path, D min, D max), kernel, (arguments before the norm), (after it), name, {teams, stages, interleave} (0: the rule)
#define TABLE_ID "bwd.f32."
#define SHARED_ROWS(ROW) \
ROW("loop", 0, (-1, kEither, kEither, false, false, 1, kNoLimit), bwd_loop, (float), (), "loop<f32", {0, 0, true}) \
ROW("dybf16.lean2", 0, (kBF16, 0, 0, true, true, 4, 1024), bwd_lean, (float, 2, kBF16), (), "lean<f32,2,dybf16", {0, 0, true}) \
ROW("dybf16.lean4", 0, (kBF16, 0, 0, true, true, 1028, 8192), bwd_lean, (float, 4, kBF16), (), "lean<f32,4,dybf16", {0, 0, true}) \
ROW("dybf16.plain.vec1", 0, (kBF16, 0, 0, false, true, 4, 512), bwd_general, (float, 1, kBF16, false, false), (), "vector<f32,1,dybf16,plain", {0, 0, true}) \
ROW("dybf16.plain.vec2", 0, (kBF16, 0, 0, false, true, 516, 4096), bwd_general, (float, 2, kBF16, false, false), (), "vector<f32,2,dybf16,plain", {0, 0, true}) \
ROW("dybf16.plain.vec4", 0, (kBF16, 0, 0, false, true, 4100, 8192), bwd_general, (float, 4, kBF16, false, false), (), "vector<f32,4,dybf16,plain", {0, 0, true}) \
ROW("dybf16.plain.affine.vec1", 0, (kBF16, 0, 1, false, true, 4, 512), bwd_general, (float, 1, kBF16, false, true), (), "vector<f32,1,dybf16,plain.affine", {0, 0, true}) \
ROW("dybf16.plain.affine.vec2", 0, (kBF16, 0, 1, false, true, 516, 4096), bwd_general, (float, 2, kBF16, false, true), (), "vector<f32,2,dybf16,plain.affine", {0, 0, true}) \
ROW("dybf16.plain.affine.vec4", 0, (kBF16, 0, 1, false, true, 4100, 8192), bwd_general, (float, 4, kBF16, false, true), (), "vector<f32,4,dybf16,plain.affine", {0, 0, true}) \
ROW("dybf16.gated.vec1", 0, (kBF16, 1, 0, false, true, 4, 512), bwd_general, (float, 1, kBF16, true, false), (), "vector<f32,1,dybf16,gated", {0, 0, true}) \
ROW("dybf16.gated.vec2", 0, (kBF16, 1, 0, false, true, 516, 4096), bwd_general, (float, 2, kBF16, true, false), (), "vector<f32,2,dybf16,gated", {0, 0, true}) \
ROW("dybf16.gated.vec4", 0, (kBF16, 1, 0, false, true, 4100, 8192), bwd_general, (float, 4, kBF16, true, false), (), "vector<f32,4,dybf16,gated", {0, 0, true}) \
ROW("dybf16.gated.affine.vec1", 0, (kBF16, 1, 1, false, true, 4, 512), bwd_general, (float, 1, kBF16, true, true), (), "vector<f32,1,dybf16,gated.affine", {0, 0, true}) \
ROW("dybf16.gated.affine.vec2", 0, (kBF16, 1, 1, false, true, 516, 4096), bwd_general, (float, 2, kBF16, true, true), (), "vector<f32,2,dybf16,gated.affine", {0, 0, true}) \
ROW("dybf16.gated.affine.vec4", 0, (kBF16, 1, 1, false, true, 4100, 8192), bwd_general, (float, 4, kBF16, true, true), (), "vector<f32,4,dybf16,gated.affine", {0, 0, true}) \
ROW("dy32.lean2", 0, (kF32, 0, 0, true, true, 4, 1024), bwd_lean, (float, 2, kF32), (), "lean<f32,2,dy32", {0, 0, true}) \
ROW("dy32.lean4", 0, (kF32, 0, 0, true, true, 1028, 8192), bwd_lean, (float, 4, kF32), (), "lean<f32,4,dy32", {0, 0, true}) \
ROW("dy32.plain.vec1", 0, (kF32, 0, 0, false, true, 4, 512), bwd_general, (float, 1, kF32, false, false), (), "vector<f32,1,dy32,plain", {0, 0, true}) \
ROW("dy32.plain.vec2", 0, (kF32, 0, 0, false, true, 516, 4096), bwd_general, (float, 2, kF32, false, false), (), "vector<f32,2,dy32,plain", {0, 0, true}) \
ROW("dy32.plain.vec4", 0, (kF32, 0, 0, false, true, 4100, 8192), bwd_general, (float, 4, kF32, false, false), (), "vector<f32,4,dy32,plain", {0, 0, true}) \
ROW("dy32.plain.affine.vec1", 0, (kF32, 0, 1, false, true, 4, 512), bwd_general, (float, 1, kF32, false, true), (), "vector<f32,1,dy32,plain.affine", {0, 0, true}) \
ROW("dy32.plain.affine.vec2", 0, (kF32, 0, 1, false, true, 516, 4096), bwd_general, (float, 2, kF32, false, true), (), "vector<f32,2,dy32,plain.affine", {0, 0, true}) \
ROW("dy32.plain.affine.vec4", 0, (kF32, 0, 1, false, true, 4100, 8192), bwd_general, (float, 4, kF32, false, true), (), "vector<f32,4,dy32,plain.affine", {0, 0, true}) \
ROW("dy32.gated.vec1", 0, (kF32, 1, 0, false, true, 4, 512), bwd_general, (float, 1, kF32, true, false), (), "vector<f32,1,dy32,gated", {0, 0, true}) \
ROW("dy32.gated.vec2", 0, (kF32, 1, 0, false, true, 516, 4096), bwd_general, (float, 2, kF32, true, false), (), "vector<f32,2,dy32,gated", {0, 0, true}) \
ROW("dy32.gated.vec4", 0, (kF32, 1, 0, false, true, 4100, 8192), bwd_general, (float, 4, kF32, true, false), (), "vector<f32,4,dy32,gated", {0, 0, true}) \
ROW("dy32.gated.affine.vec1", 0, (kF32, 1, 1, false, true, 4, 512), bwd_general, (float, 1, kF32, true, true), (), "vector<f32,1,dy32,gated.affine", {0, 0, true}) \
ROW("dy32.gated.affine.vec2", 0, (kF32, 1, 1, false, true, 516, 4096), bwd_general, (float, 2, kF32, true, true), (), "vector<f32,2,dy32,gated.affine", {0, 0, true}) \
ROW("dy32.gated.affine.vec4", 0, (kF32, 1, 1, false, true, 4100, 8192), bwd_general, (float, 4, kF32, true, true), (), "vector<f32,4,dy32,gated.affine", {0, 0, true})
constexpr BwdRow kRows[] = {SHARED_ROWS(LAYER_NORM_ROW) SHARED_ROWS(RMS_NORM_ROW)};
#undef SHARED_ROWS
#undef TABLE_ID
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<BwdRow> kBwdTableF32 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
