/*
 * hash.c: XXH64, the counter-based dt_hash_u64 and bounded draws from it (see hash.h).
 */
#include "config.h"

#include "hash.h"

#include <endian.h>
#include <string.h>

/* ---- XXH64 ---------------------------------------------------------------------- */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
/* Little-endian loads: any alignment (memcpy), any host byte order (le64toh); one load
 * each, where a byte-by-byte loop ran the whole hash at 2 GB/s */
static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return le64toh(v);
}
static uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return le32toh(v);
}
static uint64_t xround(uint64_t acc, uint64_t in) { return rotl64(acc + in * P2, 31) * P1; }
static uint64_t xmerge(uint64_t h, uint64_t v) { return (h ^ xround(0, v)) * P1 + P4; }

/* Whole 32-byte stripes of [p, end) into the four lanes; where they stopped. */
static const unsigned char *stripes(uint64_t v[4], const unsigned char *p, const unsigned char *end) {
    uint64_t v1 = v[0], v2 = v[1], v3 = v[2], v4 = v[3];
    for (; end - p >= 32; p += 32) {
        v1 = xround(v1, rd64(p));
        v2 = xround(v2, rd64(p + 8));
        v3 = xround(v3, rd64(p + 16));
        v4 = xround(v4, rd64(p + 24));
    }
    v[0] = v1, v[1] = v2, v[2] = v3, v[3] = v4;
    return p;
}

void dt_xxh64_init(dt_xxh64_state *s, uint64_t seed) {
    s->v[0] = seed + P1 + P2;
    s->v[1] = seed + P2;
    s->v[2] = seed;
    s->v[3] = seed - P1;
    s->seed = seed;
    s->total = 0;
    s->nbuf = 0;
}

void dt_xxh64_update(dt_xxh64_state *s, const void *data, size_t n) {
    const unsigned char *p = data, *end = p + n;
    if (!n) return;
    s->total += n;
    if (s->nbuf) {   /* a stripe begun by the last piece */
        size_t take = 32 - s->nbuf < n ? 32 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take;
        p += take;
        if (s->nbuf < 32) return;
        stripes(s->v, s->buf, s->buf + 32);
        s->nbuf = 0;
    }
    p = stripes(s->v, p, end);
    s->nbuf = (size_t)(end - p);
    if (s->nbuf) memcpy(s->buf, p, s->nbuf);
}

uint64_t dt_xxh64_digest(const dt_xxh64_state *s) {
    const unsigned char *p = s->buf, *end = p + s->nbuf;
    const uint64_t *v = s->v;
    uint64_t h;
    if (s->total >= 32) {
        h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
        h = xmerge(xmerge(xmerge(xmerge(h, v[0]), v[1]), v[2]), v[3]);
    } else {
        h = s->seed + P5;
    }
    h += s->total;
    for (; end - p >= 8; p += 8) h = rotl64(h ^ xround(0, rd64(p)), 27) * P1 + P4;
    if (end - p >= 4) {
        h = rotl64(h ^ (uint64_t)rd32(p) * P1, 23) * P2 + P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl64(h ^ (uint64_t)*p * P5, 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t dt_xxh64(const void *data, size_t n, uint64_t seed) {
    dt_xxh64_state s;
    dt_xxh64_init(&s, seed);
    dt_xxh64_update(&s, data, n);
    return dt_xxh64_digest(&s);
}

/* ---- counter-based hash ------------------------------------------------------------- */

/* The SplitMix64 finaliser. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t dt_hash_u64(uint64_t key, uint64_t a, uint64_t b) {
    /* Three chained rounds; the odd constants keep (0,0,0) away from 0. */
    uint64_t h = mix64(key + 0x9e3779b97f4a7c15ULL);
    h = mix64(h ^ (a + 0x632be59bd9b4e019ULL));
    return mix64(h ^ (b + 0x85ebca6b27d4eb4fULL));
}

uint64_t dt_hash_below(uint64_t key, uint64_t i, uint64_t bound) {
    /* r * bound / 2^64 is uniform unless the low half of the product falls below
     * 2^64 mod bound; that rare case draws again with the next attempt counter. */
    uint64_t threshold = (0 - bound) % bound;
    for (uint64_t attempt = 0;; attempt++) {
        uint64_t r = dt_hash_u64(key, i, attempt);
        unsigned __int128 m = (unsigned __int128)r * bound;
        if ((uint64_t)m >= threshold) return (uint64_t)(m >> 64);
    }
}
