//! `/proc/<pid>/mountinfo`'s text: the kernel escapes a space, tab, newline and backslash in its
//! path fields as three octal digits.

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes.get(i + 1..i + 4).unwrap_or_default();
        if bytes[i] == b'\\'
            && digits.len() == 3
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        {
            // Three octal digits are at most 0o777; the kernel only escapes bytes (≤ 0o377).
            let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn octal_escapes_become_bytes_and_anything_else_stays() {
        assert_eq!(unescape(r"/a\040b\011c\012d\134e"), "/a b\tc\nd\\e");
        // Not three octal digits, or above a byte: left as it is.
        assert_eq!(unescape(r"/x\04"), r"/x\04");
        assert_eq!(unescape(r"/x\089"), r"/x\089");
        assert_eq!(unescape(r"/x\777"), r"/x\777");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
