//! Reading files whose path comes from outside (a request, an image, a spec directory) without
//! trusting what the path names.

use std::path::Path;

/// Reads a small text file the request or the image points at (a seccomp profile, the
/// image's passwd and group files) without trusting what it is: anything but a regular file
/// is refused (a FIFO would block the read forever, `/dev/zero` would never end, and merely
/// opening some devices has effects), and at most `max` bytes are read. The type is checked
/// before the open, and again with `fstat` after a non-blocking open in case the path was
/// swapped in between.
pub fn read_regular_file(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular =
        || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(text)
}
