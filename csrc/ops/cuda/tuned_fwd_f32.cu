// The forward tuning table for f32 x: first match wins (dispatch.cu). Each line is a
// LayerNorm row and its RMSNorm twin (configs.h: shared rows); no row is tuned for one norm
// alone today. Each row's kernel is instantiated here and nowhere else. See configs.h for the
// columns and docs/ops.md for how the rows were measured; benchmarks/tune_layer_norm_modulate.py
// prints candidate rows from a sweep.
#include "launch.cuh"

namespace adaptiveload {
namespace {

// clang-format off
// id (after TABLE_ID), arch, (op, modulation, vector path, D min, D max, rows min, rows max), kernel, (arguments before the norm), (after it), name, {warps, stages, y_words, interleave}
#define TABLE_ID "fwd.f32."
#define SHARED_ROWS(ROW) \
ROW("loop", 0, (kEither, Mod::kAny, false, 1, kNoLimit, 1, kNoLimit), fwd_loop, (float), (), "loop<f32", {8, 2, false, true}) \
ROW("plain.token.block1", 0, (0, Mod::kToken, true, 4, 1024, 1, kNoLimit), fwd_block, (float, 1, false), (, 1), "block<f32,1,plain,hoist", {8, 2, false, true}) \
ROW("plain.token.block2", 0, (0, Mod::kToken, true, 1028, 2048, 1, kNoLimit), fwd_block, (float, 2, false), (, 1), "block<f32,2,plain,hoist", {8, 2, false, true}) \
ROW("plain.token.block4", 0, (0, Mod::kToken, true, 2052, 4096, 1, kNoLimit), fwd_block, (float, 4, false), (), "block<f32,4,plain", {8, 2, false, true}) \
ROW("plain.token.block8", 0, (0, Mod::kToken, true, 4100, 16384, 1, kNoLimit), fwd_block, (float, 8, false), (), "block<f32,8,plain", {8, 2, false, true}) \
ROW("plain.block.warp4x2x1", 0, (0, Mod::kBlock, true, 4, 512, 1, kNoLimit), fwd_warp, (float, 4, 2, 1, false), (), "warp<f32,4,2,1,plain", {8, 2, true, true}) \
ROW("plain.block.warp6x2x1", 0, (0, Mod::kBlock, true, 516, 768, 1, kNoLimit), fwd_warp, (float, 6, 2, 1, false), (), "warp<f32,6,2,1,plain", {8, 2, true, true}) \
ROW("plain.block.warp12x1x1", 0, (0, Mod::kBlock, true, 772, 1536, 1, kNoLimit), fwd_warp, (float, 12, 1, 1, false), (), "warp<f32,12,1,1,plain", {8, 2, true, true}) \
ROW("plain.block.warp10x1x2", 0, (0, Mod::kBlock, true, 1540, 2560, 1, kNoLimit), fwd_warp, (float, 10, 1, 2, false), (), "warp<f32,10,1,2,plain", {8, 2, true, true}) \
ROW("plain.block.warp12x1x2", 0, (0, Mod::kBlock, true, 2564, 3072, 1, kNoLimit), fwd_warp, (float, 12, 1, 2, false), (), "warp<f32,12,1,2,plain", {8, 2, true, true}) \
ROW("plain.block.warp10x1x4", 0, (0, Mod::kBlock, true, 3076, 5120, 1, kNoLimit), fwd_warp, (float, 10, 1, 4, false), (), "warp<f32,10,1,4,plain", {8, 2, true, true}) \
ROW("plain.block.block8", 0, (0, Mod::kBlock, true, 5124, 16384, 1, kNoLimit), fwd_block, (float, 8, false), (), "block<f32,8,plain", {8, 2, false, true}) \
ROW("gated.token.block1", 0, (1, Mod::kToken, true, 4, 1024, 1, kNoLimit), fwd_block, (float, 1, true), (, 1), "block<f32,1,gated,hoist", {8, 2, false, true}) \
ROW("gated.token.block2", 0, (1, Mod::kToken, true, 1028, 2048, 1, kNoLimit), fwd_block, (float, 2, true), (, 1), "block<f32,2,gated,hoist", {8, 2, false, true}) \
ROW("gated.token.block4", 0, (1, Mod::kToken, true, 2052, 4096, 1, kNoLimit), fwd_block, (float, 4, true), (), "block<f32,4,gated", {8, 2, false, true}) \
ROW("gated.token.block8", 0, (1, Mod::kToken, true, 4100, 16384, 1, kNoLimit), fwd_block, (float, 8, true), (), "block<f32,8,gated", {8, 2, false, true}) \
ROW("gated.block.warp4x2x1", 0, (1, Mod::kBlock, true, 4, 512, 1, kNoLimit), fwd_warp, (float, 4, 2, 1, true), (), "warp<f32,4,2,1,gated", {8, 2, true, true}) \
ROW("gated.block.warp6x2x1", 0, (1, Mod::kBlock, true, 516, 768, 1, kNoLimit), fwd_warp, (float, 6, 2, 1, true), (), "warp<f32,6,2,1,gated", {8, 2, true, true}) \
ROW("gated.block.warp12x1x1", 0, (1, Mod::kBlock, true, 772, 1536, 1, kNoLimit), fwd_warp, (float, 12, 1, 1, true), (), "warp<f32,12,1,1,gated", {8, 2, true, true}) \
ROW("gated.block.warp10x1x2", 0, (1, Mod::kBlock, true, 1540, 2560, 1, kNoLimit), fwd_warp, (float, 10, 1, 2, true), (), "warp<f32,10,1,2,gated", {8, 2, true, true}) \
ROW("gated.block.warp12x1x2", 0, (1, Mod::kBlock, true, 2564, 3072, 1, kNoLimit), fwd_warp, (float, 12, 1, 2, true), (), "warp<f32,12,1,2,gated", {8, 2, true, true}) \
ROW("gated.block.warp10x1x4", 0, (1, Mod::kBlock, true, 3076, 5120, 1, kNoLimit), fwd_warp, (float, 10, 1, 4, true), (), "warp<f32,10,1,4,gated", {8, 2, true, true}) \
ROW("gated.block.block8", 0, (1, Mod::kBlock, true, 5124, 16384, 1, kNoLimit), fwd_block, (float, 8, true), (), "block<f32,8,gated", {8, 2, false, true})
constexpr FwdRow kRows[] = {SHARED_ROWS(LAYER_NORM_ROW) SHARED_ROWS(RMS_NORM_ROW)};
#undef SHARED_ROWS
#undef TABLE_ID
// clang-format on
static_assert(norms_agree(kRows), "a row's norm must be its kernel's");

}  // namespace

const Table<FwdRow> kFwdTableF32 = {kRows, sizeof(kRows) / sizeof(kRows[0])};

}  // namespace adaptiveload
