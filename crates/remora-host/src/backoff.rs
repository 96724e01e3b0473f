//! Exponential backoff: a delay that doubles after each failure up to a cap, and resets on
//! success. Shared by the containerd health monitor, registry retries, the digest resolver, the
//! event backoff queue and the shim's event publisher, so they all follow one schedule rule.

use std::time::Duration;

/// Doubling delay between `min` and `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `min`; `max` is raised to `min` if smaller.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The delay to wait now; the following call returns twice as much, capped at `max`.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        d
    }

    /// The delay [`Backoff::next_delay`] would return now, without moving on.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Back to `min` (after a success).
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let got: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 5]);
        assert_eq!(b.peek(), Duration::from_secs(5));
        b.reset();
        assert_eq!(b.peek(), Duration::from_secs(1));
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn max_below_min_is_raised() {
        let mut b = Backoff::new(Duration::from_secs(3), Duration::from_secs(1));
        assert_eq!(b.next_delay(), Duration::from_secs(3));
        assert_eq!(b.next_delay(), Duration::from_secs(3));
    }
}
