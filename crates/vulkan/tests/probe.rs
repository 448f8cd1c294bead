//! Device start and probe: a device's tiers, or a clear reason why there is none.

mod common;

use resin_vulkan::buffers::{submit_once, Buffer, Location, Timestamps};

#[test]
fn probe_reports_tiers_or_says_why_not() {
    match resin_vulkan::probe() {
        Ok(info) => {
            eprintln!("{}", info.describe());
            assert!(info.subgroup_size >= 1);
            assert!(info.max_storage_range >= 1 << 27, "Vulkan guarantees at least 128 MiB? got {}", info.max_storage_range);
            assert!(!info.heaps.is_empty());
            assert!(info.shared_memory >= 16 * 1024);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("no Vulkan"), "an unclear reason: {msg}");
            if std::env::var("RESIN_REQUIRE_VULKAN").as_deref() == Ok("1") {
                panic!("RESIN_REQUIRE_VULKAN=1: {msg}");
            }
        }
    }
}

#[test]
fn buffers_round_trip_and_timestamps() {
    let Some(gpu) = common::gpu() else { return };
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    for loc in [Location::Device, Location::Host] {
        let b = Buffer::with_data(&gpu, &data, loc).unwrap();
        let mut back = vec![0u8; data.len()];
        b.read(0, &mut back).unwrap();
        assert_eq!(back, data);
        let mut tail = vec![0u8; 10];
        assert!(b.read(b.size - 4, &mut tail).is_err(), "a read past the end is an error");
    }
    // A transfer between two buffers, timed.
    let src = Buffer::with_data(&gpu, &data, Location::Device).unwrap();
    let dst = Buffer::new(&gpu, data.len() as u64, Location::Device).unwrap();
    let ts = Timestamps::new(&gpu, 2).unwrap();
    submit_once(&gpu, |cmd| {
        if let Some(t) = &ts {
            t.reset(cmd);
            t.write(cmd, 0);
        }
        let region = [ash::vk::BufferCopy { src_offset: 0, dst_offset: 0, size: data.len() as u64 }];
        // SAFETY: both buffers are live and the region fits.
        unsafe { gpu.device.cmd_copy_buffer(cmd, src.buffer, dst.buffer, &region) };
        if let Some(t) = &ts {
            t.write(cmd, 1);
        }
    })
    .unwrap();
    let mut back = vec![0u8; data.len()];
    dst.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    if let Some(t) = ts {
        let v = t.read(2).unwrap();
        assert!(v[1] >= v[0], "timestamps go forward: {v:?}");
    }
}
