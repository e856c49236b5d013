//! Native OpenFlow 1.3+ client (flow model, codec, bundles, stats) and OVSDB JSON-RPC client for Open vSwitch.
