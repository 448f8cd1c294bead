// Byte-addressed reads of a GGUF block buffer bound as `uint WDATA[]` (32-bit words).
// Block formats are 2-byte aligned at worst (Q4_0: 18 bytes), so every read here needs no
// 8- or 16-bit storage feature: it runs on every Vulkan device.
#ifndef RESIN_BYTES_GLSL
#define RESIN_BYTES_GLSL

uint rd_u8(uint o) { return (WDATA[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
uint rd_u16(uint o) { return (WDATA[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu; }
// A 32-bit little-endian word at a 2-byte aligned offset.
uint rd_u32(uint o) {
    uint i = o >> 2;
    if ((o & 2u) == 0u) return WDATA[i];
    return (WDATA[i] >> 16) | (WDATA[i + 1u] << 16);
}
float rd_f16(uint o) { return unpackHalf2x16(rd_u16(o)).x; }
// The 8 words at a 2-byte aligned offset, each buffer word loaded once (8, or 9 when o is
// not 4-byte aligned: then each word is two halves of neighbours).
void rd_u32x8(uint o, out uint w[8]) {
    uint i = o >> 2;
    uint v[8];
    for (uint j = 0u; j < 8u; j++) v[j] = WDATA[i + j];
    if ((o & 2u) == 0u) {
        w = v;
        return;
    }
    uint last = WDATA[i + 8u];
    for (uint j = 0u; j < 7u; j++) w[j] = (v[j] >> 16) | (v[j + 1u] << 16);
    w[7] = (v[7] >> 16) | (last << 16);
}
// Byte b (0..3) of w as an unsigned / signed value.
uint byte_of(uint w, uint b) { return (w >> (b * 8u)) & 0xFFu; }
int sbyte_of(uint w, uint b) { return bitfieldExtract(int(w), int(b * 8u), 8); }

#endif
