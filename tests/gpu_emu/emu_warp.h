/*
 * gpu_emu/emu_warp.h: warp-level intrinsics and vector types for the CUDA stand-in
 * (included by cuda_runtime.h here).
 *
 * A warp is 32 consecutive threads of a block (linear thread index / 32), as on the
 * GPU. A shuffle is a rendezvous of the warp: each lane leaves its value in a slot
 * (emu.cpp), waits until every lane named by the mask has arrived (emu_warp_sync: the
 * scheduler resumes the warp only then, while other warps may wait at __syncthreads),
 * reads its source lane's slot, and waits once more so that no lane overwrites a slot
 * before all have read it. A lane of the mask that has exited, or a warp whose lanes
 * wait at different kinds of barrier, stops the program with a message (on a GPU:
 * undefined behaviour or a hang).
 */
#ifndef DT_GPU_EMU_WARP_H
#define DT_GPU_EMU_WARP_H

#include <cstdint>
#include <cstring>

#define warpSize 32

/* Wait until every lane of this thread's warp named in `mask` is here (emu.cpp). */
void emu_warp_sync(unsigned mask);
/* One 8-byte slot per thread of the block, for the values of a shuffle (emu.cpp). */
uint64_t *emu_shfl_slots(void);

static inline unsigned emu_linear_tid(void) {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu_warp_sync(mask); }

/* The value of `v` held by lane `src` of this thread's group of `width` lanes. */
template <class T> static inline T emu_shfl(unsigned mask, T v, int src, int width) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
    const unsigned me = emu_linear_tid(), lane = me % 32u, base = me - lane;
    const unsigned w = width > 0 && width <= 32 ? (unsigned)width : 32u;
    const unsigned from = base + (lane & ~(w - 1u)) + ((unsigned)src & (w - 1u));
    uint64_t *slot = emu_shfl_slots(), bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    slot[me] = bits;
    emu_warp_sync(mask);           /* every lane's value is in place */
    T r;
    std::memcpy(&r, &slot[from], sizeof r);
    emu_warp_sync(mask);           /* every lane has read before a slot is reused */
    return r;
}

template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return emu_shfl(mask, v, src, width);
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return emu_shfl(mask, v, (int)(emu_linear_tid() % 32u) ^ lane_mask, width);
}
/* As on the GPU, a lane whose source is beyond its group keeps its own value. */
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const unsigned w = width > 0 && width <= 32 ? (unsigned)width : 32u, lane = emu_linear_tid() % 32u;
    const unsigned in_group = lane & (w - 1u);
    T r = emu_shfl(mask, v, (int)(lane + delta), width);
    return in_group + delta < w ? r : v;
}

/* Vector types: 16-byte aligned as CUDA's, so a float4 load needs an aligned address. */
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

#endif
