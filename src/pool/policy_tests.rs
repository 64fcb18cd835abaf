use super::*;

const MS: Duration = Duration::from_millis(1);

fn bounds(floor: usize, ceiling: usize) -> Bounds {
    Bounds::new(floor, ceiling, Duration::from_secs(60)).unwrap()
}

/// A pool that measured `ready` as its time to ready.
fn measured(ready: Duration) -> Demand {
    let mut d = Demand::default();
    d.became_ready(ready);
    d
}

/// `n` calls `every` apart from `start`; the instant of the last.
fn burst(d: &mut Demand, b: &Bounds, start: Instant, n: usize, every: Duration) -> Instant {
    let mut t = start;
    for i in 0..n {
        t = start + every * i as u32;
        d.arrived(t, b);
    }
    t
}

#[test]
fn bad_bounds_are_refused_with_the_key_named() {
    let s = Duration::from_secs(60);
    assert_eq!(
        Bounds::new(4, 2, s),
        Err(Error::CeilingBelowFloor {
            floor: 4,
            ceiling: 2
        })
    );
    assert!(Bounds::new(4, 2, s)
        .unwrap_err()
        .to_string()
        .contains("pool_max (2) is below pool_size (4)"));
    assert_eq!(
        Bounds::new(2, MAX_CEILING + 1, s),
        Err(Error::CeilingTooHigh {
            ceiling: MAX_CEILING + 1
        })
    );
    assert_eq!(
        Bounds::new(MAX_CEILING + 1, MAX_CEILING + 1, s),
        Err(Error::FloorTooHigh {
            floor: MAX_CEILING + 1
        })
    );
    assert_eq!(Bounds::new(2, 8, Duration::ZERO), Err(Error::NoShrinkDelay));
    // A floor of 0 turns the pool off whatever the rest says.
    assert!(Bounds::new(0, 0, Duration::ZERO).unwrap().is_off());
    assert!(Bounds::new(0, 8, s).unwrap().is_off());
    assert_eq!(Bounds::new(2, 2, s), Ok(Bounds::fixed(2)));
}

#[test]
fn a_lone_call_keeps_the_floor() {
    let b = bounds(2, 8);
    let mut d = measured(40 * MS);
    let t0 = Instant::now();
    d.arrived(t0, &b);
    assert_eq!(d.target(t0, &b), 2);
    assert!(
        !d.in_burst(t0),
        "nothing else arrived within a time to ready"
    );
    // Calls a second apart never raise it.
    for i in 1..20 {
        let t = t0 + Duration::from_secs(i);
        d.arrived(t, &b);
        assert_eq!(d.target(t, &b), 2);
    }
}

#[test]
fn a_burst_grows_the_pool_to_cover_the_arrivals_within_a_time_to_ready() {
    let b = bounds(2, 16);
    // 40 ms to ready, a call every 5 ms: 8 calls arrive while a replacement starts.
    let mut d = measured(40 * MS);
    let t0 = Instant::now();
    let mut targets = Vec::new();
    for i in 0..20 {
        let t = t0 + 5 * MS * i;
        d.arrived(t, &b);
        targets.push(d.target(t, &b));
    }
    // It grows with every arrival until the window is full: grows fast.
    assert_eq!(targets[..8], [2, 3, 4, 5, 6, 7, 8, 9]);
    assert!(targets[8..].iter().all(|&t| t == 9), "{targets:?}");
    let last = t0 + 5 * MS * 19;
    assert!(d.in_burst(last));
    assert_eq!(d.rate_per_s(last), 20.0);
}

#[test]
fn a_faster_start_needs_a_smaller_pool_for_the_same_burst() {
    // What the window follows is measured: a fork of a pre-initialised interpreter (a few
    // ms) needs less than a full interpreter start (hundreds of ms) for the same calls.
    let b = bounds(1, 64);
    let t0 = Instant::now();
    let mut slow = measured(400 * MS);
    let mut fast = measured(6 * MS);
    let end = burst(&mut slow, &b, t0, 20, 4 * MS);
    burst(&mut fast, &b, t0, 20, 4 * MS);
    assert_eq!(slow.target(end, &b), 21);
    assert_eq!(fast.target(end, &b), 3);
}

#[test]
fn the_window_follows_the_measured_time_to_ready() {
    let mut d = Demand::default();
    assert_eq!(d.ready(), None);
    assert_eq!(d.window(), ASSUMED_READY);
    d.became_ready(100 * MS);
    assert_eq!(d.window(), 100 * MS);
    // One slow start moves it a quarter of the way.
    d.became_ready(500 * MS);
    assert_eq!(d.window(), 200 * MS);
    // A start that hung counts at most MAX_READY.
    for _ in 0..50 {
        d.became_ready(Duration::from_secs(3600));
    }
    assert!(d.window() <= MAX_READY);
}

#[test]
fn the_pool_holds_its_size_through_a_pause_then_shrinks_to_the_floor() {
    let b = Bounds::new(2, 16, Duration::from_secs(30)).unwrap();
    let mut d = measured(40 * MS);
    let t0 = Instant::now();
    let end = burst(&mut d, &b, t0, 20, 5 * MS);
    assert_eq!(d.target(end, &b), 9);
    // Idle, but within shrink_after of the last time the demand reached 9: held.
    assert_eq!(d.next_change(&b), Some(end + b.shrink_after));
    assert_eq!(d.target(end + Duration::from_secs(20), &b), 9);
    // A second burst after the pause finds it, and holds it again.
    let second = end + Duration::from_secs(25);
    let end2 = burst(&mut d, &b, second, 20, 5 * MS);
    assert_eq!(d.target(end2 + Duration::from_secs(29), &b), 9);
    // Then idle for longer than shrink_after: back to the floor, and nothing to wait for.
    let idle = end2 + Duration::from_secs(31);
    assert_eq!(d.target(idle, &b), 2);
    assert_eq!(d.next_change(&b), None);
    assert_eq!(d.rate_per_s(idle), 0.0);
}

#[test]
fn a_steady_load_keeps_its_target_past_shrink_after() {
    let b = Bounds::new(1, 16, Duration::from_secs(1)).unwrap();
    let mut d = measured(100 * MS);
    let t0 = Instant::now();
    // A call every 20 ms for 5 s: 5 within a time to ready, all along.
    let end = burst(&mut d, &b, t0, 250, 20 * MS);
    assert_eq!(d.target(end, &b), 6);
    assert!(d.next_change(&b).is_some_and(|t| t > end));
}

#[test]
fn a_flood_never_passes_the_ceiling_and_the_record_stays_bounded() {
    let b = bounds(2, 8);
    let mut d = measured(Duration::from_secs(1));
    let t0 = Instant::now();
    // 100,000 calls at once (as fast as anything could take): the ceiling holds.
    for i in 0..100_000u32 {
        let t = t0 + Duration::from_nanos(u64::from(i));
        d.arrived(t, &b);
        assert!(d.target(t, &b) <= 8);
    }
    assert_eq!(d.target(t0 + 100 * MS, &b), 8);
    assert_eq!(d.arrivals.len(), ARRIVALS_KEPT);
    // The rate saturates at what the record holds; it never overflows or divides by 0.
    assert_eq!(d.rate_per_s(t0 + 100 * MS), ARRIVALS_KEPT as f64);
    // And once the flood stops, it falls back to the floor after shrink_after.
    assert_eq!(d.target(t0 + Duration::from_secs(62), &b), 2);
}

#[test]
fn the_floor_holds_without_any_arrival() {
    let b = bounds(3, 8);
    let mut d = Demand::default();
    let t0 = Instant::now();
    assert_eq!(d.target(t0, &b), 3);
    assert_eq!(d.target(t0 + Duration::from_secs(3600), &b), 3);
    assert_eq!(d.next_change(&b), None);
    // A fixed pool is a fixed pool, whatever arrives.
    let f = Bounds::fixed(2);
    let mut d = measured(Duration::from_secs(1));
    let end = burst(&mut d, &f, t0, 50, MS);
    assert_eq!(d.target(end, &f), 2);
}

#[test]
fn arrivals_out_of_order_or_at_one_instant_do_not_panic() {
    // Instants from several threads may be recorded slightly out of order.
    let b = bounds(2, 8);
    let mut d = measured(10 * MS);
    let t0 = Instant::now() + Duration::from_secs(1);
    d.arrived(t0, &b);
    d.arrived(t0 - 5 * MS, &b);
    d.arrived(t0, &b);
    assert!(d.target(t0, &b) <= 8);
    assert!(d.target(t0 - Duration::from_secs(1), &b) >= 2);
}
