use super::*;

#[test]
fn exec_pid_files_keep_a_short_safe_name() {
    assert_eq!(short("abc/../def-01_x"), "abcdef-01_x");
}
