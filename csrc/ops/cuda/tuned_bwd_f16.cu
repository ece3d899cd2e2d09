// The backward tuning table for f16 x: first match wins (dispatch.cu). Each line is a
// LayerNorm row and its RMSNorm twin (configs.h: shared rows); no row is tuned for one norm
// alone today. Each row's kernel is instantiated here and nowhere else. See configs.h for the
// columns and docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py
// prints candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
// id (after TABLE_ID), arch, (dy kind, op, affine, lean case, vector path, D min, D max), kernel, (arguments before the norm), (after it), name, {teams, stages, interleave} (0: the rule)
#define TABLE_ID "bwd.f16."
#define SHARED_ROWS(ROW) \
ROW("loop", 0, (-1, kEither, kEither, false, false, 1, kNoLimit), bwd_loop, (c10::Half), (), "loop<f16", {0, 0, true}) \
ROW("dy16.lean1", 0, (kF16, 0, 0, true, true, 8, 1024), bwd_lean, (c10::Half, 1, kF16), (), "lean<f16,1,dy16", {0, 0, true}) \
ROW("dy16.lean2", 0, (kF16, 0, 0, true, true, 1032, 8192), bwd_lean, (c10::Half, 2, kF16), (), "lean<f16,2,dy16", {0, 0, true}) \
ROW("dy16.token2", 0, (kF16, 0, 0, false, true, 8, 4096), bwd_token, (c10::Half, 2, kF16), (), "token<f16,2,dy16", {0, 0, true}) \
ROW("dy16.plain.vec1", 0, (kF16, 0, 0, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF16, false, false), (), "vector<f16,1,dy16,plain", {0, 0, true}) \
ROW("dy16.plain.vec2", 0, (kF16, 0, 0, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF16, false, false), (), "vector<f16,2,dy16,plain", {0, 0, true}) \
ROW("dy16.plain.vec4", 0, (kF16, 0, 0, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF16, false, false), (), "vector<f16,4,dy16,plain", {0, 0, true}) \
ROW("dy16.plain.affine.vec1", 0, (kF16, 0, 1, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF16, false, true), (), "vector<f16,1,dy16,plain.affine", {0, 0, true}) \
ROW("dy16.plain.affine.vec2", 0, (kF16, 0, 1, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF16, false, true), (), "vector<f16,2,dy16,plain.affine", {0, 0, true}) \
ROW("dy16.plain.affine.vec4", 0, (kF16, 0, 1, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF16, false, true), (), "vector<f16,4,dy16,plain.affine", {0, 0, true}) \
ROW("dy16.gated.vec1", 0, (kF16, 1, 0, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF16, true, false), (), "vector<f16,1,dy16,gated", {0, 0, true}) \
ROW("dy16.gated.vec2", 0, (kF16, 1, 0, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF16, true, false), (), "vector<f16,2,dy16,gated", {0, 0, true}) \
ROW("dy16.gated.vec4", 0, (kF16, 1, 0, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF16, true, false), (), "vector<f16,4,dy16,gated", {0, 0, true}) \
ROW("dy16.gated.affine.vec1", 0, (kF16, 1, 1, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF16, true, true), (), "vector<f16,1,dy16,gated.affine", {0, 0, true}) \
ROW("dy16.gated.affine.vec2", 0, (kF16, 1, 1, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF16, true, true), (), "vector<f16,2,dy16,gated.affine", {0, 0, true}) \
ROW("dy16.gated.affine.vec4", 0, (kF16, 1, 1, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF16, true, true), (), "vector<f16,4,dy16,gated.affine", {0, 0, true}) \
ROW("dy32.lean1", 0, (kF32, 0, 0, true, true, 8, 1024), bwd_lean, (c10::Half, 1, kF32), (), "lean<f16,1,dy32", {0, 0, true}) \
ROW("dy32.lean2", 0, (kF32, 0, 0, true, true, 1032, 8192), bwd_lean, (c10::Half, 2, kF32), (), "lean<f16,2,dy32", {0, 0, true}) \
ROW("dy32.token2", 0, (kF32, 0, 0, false, true, 8, 4096), bwd_token, (c10::Half, 2, kF32), (), "token<f16,2,dy32", {0, 0, true}) \
ROW("dy32.plain.vec1", 0, (kF32, 0, 0, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF32, false, false), (), "vector<f16,1,dy32,plain", {0, 0, true}) \
ROW("dy32.plain.vec2", 0, (kF32, 0, 0, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF32, false, false), (), "vector<f16,2,dy32,plain", {0, 0, true}) \
ROW("dy32.plain.vec4", 0, (kF32, 0, 0, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF32, false, false), (), "vector<f16,4,dy32,plain", {0, 0, true}) \
ROW("dy32.plain.affine.vec1", 0, (kF32, 0, 1, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF32, false, true), (), "vector<f16,1,dy32,plain.affine", {0, 0, true}) \
ROW("dy32.plain.affine.vec2", 0, (kF32, 0, 1, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF32, false, true), (), "vector<f16,2,dy32,plain.affine", {0, 0, true}) \
ROW("dy32.plain.affine.vec4", 0, (kF32, 0, 1, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF32, false, true), (), "vector<f16,4,dy32,plain.affine", {0, 0, true}) \
ROW("dy32.gated.vec1", 0, (kF32, 1, 0, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF32, true, false), (), "vector<f16,1,dy32,gated", {0, 0, true}) \
ROW("dy32.gated.vec2", 0, (kF32, 1, 0, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF32, true, false), (), "vector<f16,2,dy32,gated", {0, 0, true}) \
ROW("dy32.gated.vec4", 0, (kF32, 1, 0, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF32, true, false), (), "vector<f16,4,dy32,gated", {0, 0, true}) \
ROW("dy32.gated.affine.vec1", 0, (kF32, 1, 1, false, true, 8, 1024), bwd_general, (c10::Half, 1, kF32, true, true), (), "vector<f16,1,dy32,gated.affine", {0, 0, true}) \
ROW("dy32.gated.affine.vec2", 0, (kF32, 1, 1, false, true, 1032, 8192), bwd_general, (c10::Half, 2, kF32, true, true), (), "vector<f16,2,dy32,gated.affine", {0, 0, true}) \
ROW("dy32.gated.affine.vec4", 0, (kF32, 1, 1, false, true, 8200, 16384), bwd_general, (c10::Half, 4, kF32, true, true), (), "vector<f16,4,dy32,gated.affine", {0, 0, true})
constexpr BwdRow kRows[] = {SHARED_ROWS(LAYER_NORM_ROW) SHARED_ROWS(RMS_NORM_ROW)};
#undef SHARED_ROWS
#undef TABLE_ID
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<BwdRow> kBwdTableF16 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
