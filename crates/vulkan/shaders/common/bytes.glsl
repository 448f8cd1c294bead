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
// Byte b (0..3) of w as an unsigned / signed value.
uint byte_of(uint w, uint b) { return (w >> (b * 8u)) & 0xFFu; }
int sbyte_of(uint w, uint b) { return bitfieldExtract(int(w), int(b * 8u), 8); }

#endif
