//! (being written)

/// Placeholder until the bootstrap lands.
pub fn main() -> i32 {
    1
}
