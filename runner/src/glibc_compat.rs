//! What lets the `dist` binary ask glibc for nothing newer than 2.34
//! (built with the `glibc-2-34` feature by `integration/build-dist.sh`).
//!
//! That build links GCC's C++ library statically, so the binary does not
//! depend on the host's `libstdc++`. GCC 12's library, configured on a
//! glibc 2.36 system, seeds `std::random_device` (RocksDB uses it) with
//! `arc4random`, which glibc has only since 2.36. Defined here, in the
//! executable, the static link resolves that call to this function, and
//! the binary needs glibc 2.34 (August 2021) instead. It reads the
//! kernel's random source, as glibc's own `arc4random` does.

/// Four random bytes from the kernel (`getrandom`, else `/dev/urandom`);
/// aborts if neither answers, as glibc's `arc4random` does.
#[no_mangle]
pub extern "C" fn arc4random() -> u32 {
    let mut bytes = [0u8; 4];
    let mut filled = 0usize;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got > 0 {
            filled += got as usize;
            continue;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        use std::io::Read;
        match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(rest)) {
            Ok(()) => filled = bytes.len(),
            Err(_) => std::process::abort(),
        }
    }
    u32::from_ne_bytes(bytes)
}

/// Keeps [`arc4random`] in the executable through link-time optimisation:
/// nothing in Rust calls it, only the C++ library does.
#[used]
static KEEP_ARC4RANDOM: extern "C" fn() -> u32 = arc4random;
