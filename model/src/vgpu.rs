//! vGPU limits file format (`/usr/local/tessera/vgpu.json`).
