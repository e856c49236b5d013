//! VM NetworkPolicy model and the pure conjunction compiler that turns it into OpenFlow flows and minimal diffs.
