/*
 * gpu_emu/cuda.h: a stand-in for the CUDA driver API header: the types of the virtual
 * memory management calls the CUDA backend fetches through
 * cudaGetDriverEntryPointByVersion (src/cuda/cuda_ops.cu). emu.cpp implements them over
 * mmap: a reserved range is inaccessible (PROT_NONE) until a granule is mapped into it,
 * and unmapping makes it inaccessible again and gives its memory back, so a kernel,
 * copy or NCCL call that touches an unmapped granule faults (SIGSEGV) as a GPU would
 * (an illegal address). The granularity is DT_GPU_EMU_GRANULE bytes (a power of two, at
 * least 4 KiB; default 2 MiB, what current GPUs report).
 */
#ifndef DT_GPU_EMU_CUDA_H
#define DT_GPU_EMU_CUDA_H

#include <stddef.h>

typedef enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
               CUDA_ERROR_NOT_SUPPORTED = 801 } CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef enum { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 } CUmemAllocationType;
typedef enum { CU_MEM_HANDLE_TYPE_NONE = 0 } CUmemAllocationHandleType;
typedef enum { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 } CUmemLocationType;
typedef enum { CU_MEM_ACCESS_FLAGS_PROT_NONE = 0, CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
               CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 } CUmemAccess_flags;
typedef enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 }
    CUmemAllocationGranularity_flags;
typedef struct {
    CUmemLocationType type;
    int id;
} CUmemLocation;
typedef struct {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

#endif
