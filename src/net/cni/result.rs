//! A plugin chain's result (CNI 0.3.0 – 1.0.0 format), parsed from the last plugin's output.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

/// A plugin chain's result (CNI 0.3.0 – 1.0.0 format).
#[derive(Debug, Clone, PartialEq)]
pub struct CniResult {
    /// `cniVersion` of the result.
    pub cni_version: String,
    /// Interfaces created or configured.
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    pub ips: Vec<IpConfig>,
    /// Routes added.
    pub routes: Vec<Route>,
    /// DNS settings the plugins suggest.
    pub dns: Dns,
    /// The result as the plugin printed it; passed on as `prevResult` unchanged, so fields this
    /// type does not model survive.
    pub raw: Value,
}

/// An interface in a result.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC address, if reported.
    #[serde(default)]
    pub mac: String,
    /// The namespace path for interfaces inside the container; empty for host-side ones.
    #[serde(default)]
    pub sandbox: String,
}

/// An address in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address.
    pub address: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// The gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` of the interface holding it.
    pub interface: Option<usize>,
}

/// A route in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network address.
    pub dst: IpAddr,
    /// Destination prefix length.
    pub dst_prefix_len: u8,
    /// Next hop; `None` means the interface's default gateway.
    pub gw: Option<IpAddr>,
}

/// DNS settings in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Dns {
    /// Name servers.
    pub nameservers: Vec<String>,
    /// Local domain.
    pub domain: String,
    /// Search domains.
    pub search: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

impl CniResult {
    /// Parses a result printed by a plugin.
    pub fn parse(raw: Value) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct RawIp {
            address: String,
            #[serde(default)]
            gateway: Option<String>,
            #[serde(default)]
            interface: Option<usize>,
        }
        #[derive(Deserialize)]
        struct RawRoute {
            dst: String,
            #[serde(default)]
            gw: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct RawResult {
            #[serde(default)]
            cni_version: String,
            #[serde(default)]
            interfaces: Vec<Interface>,
            #[serde(default)]
            ips: Vec<RawIp>,
            #[serde(default)]
            routes: Vec<RawRoute>,
            #[serde(default)]
            dns: Dns,
        }
        let r: RawResult = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
        let opt_ip = |s: &Option<String>| -> Result<Option<IpAddr>, String> {
            match s.as_deref() {
                None | Some("") => Ok(None),
                Some(s) => s
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("{s:?} is not an IP address")),
            }
        };
        let mut ips = Vec::with_capacity(r.ips.len());
        for i in &r.ips {
            let (address, prefix_len) = parse_cidr(&i.address)?;
            if let Some(idx) = i.interface {
                if idx >= r.interfaces.len() {
                    return Err(format!(
                        "ip {} names interface {idx}, but there are {}",
                        i.address,
                        r.interfaces.len()
                    ));
                }
            }
            ips.push(IpConfig {
                address,
                prefix_len,
                gateway: opt_ip(&i.gateway)?,
                interface: i.interface,
            });
        }
        let mut routes = Vec::with_capacity(r.routes.len());
        for rt in &r.routes {
            let (dst, dst_prefix_len) = parse_cidr(&rt.dst)?;
            routes.push(Route {
                dst,
                dst_prefix_len,
                gw: opt_ip(&rt.gw)?,
            });
        }
        Ok(Self {
            cni_version: r.cni_version,
            interfaces: r.interfaces,
            ips,
            routes,
            dns: r.dns,
            raw,
        })
    }

    /// The pod's addresses, primary first, chosen as containerd does: the addresses on the
    /// sandbox interface `ifname` (all addresses if the result does not say which interface
    /// holds them), in result order except that the first IPv4 address leads.
    pub fn pod_ips(&self, ifname: &str) -> Vec<IpAddr> {
        let on_ifname = |c: &&IpConfig| {
            c.interface
                .and_then(|i| self.interfaces.get(i))
                .is_some_and(|i| i.name == ifname && !i.sandbox.is_empty())
        };
        let mut ips: Vec<IpAddr> = self
            .ips
            .iter()
            .filter(on_ifname)
            .map(|c| c.address)
            .collect();
        if ips.is_empty() && self.ips.iter().all(|c| c.interface.is_none()) {
            ips = self.ips.iter().map(|c| c.address).collect();
        }
        if let Some(v4) = ips.iter().position(|ip| ip.is_ipv4()) {
            let first = ips.remove(v4);
            ips.insert(0, first);
        }
        ips
    }
}

fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
    let bad = || format!("{s:?} is not an address/prefix");
    let (addr, len) = s.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(bad());
    }
    Ok((addr, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_a_1_0_0_result_and_picks_ipv4_first() {
        let raw = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/run/netns/x"}
            ],
            "ips": [
                {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2},
                {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 2},
                {"address": "10.9.0.1/24", "interface": 0}
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.2.0.0/16", "gw": "10.1.0.254"}],
            "dns": {"nameservers": ["10.0.0.10"], "search": ["svc.cluster.local"]}
        });
        let r = CniResult::parse(raw.clone()).unwrap();
        assert_eq!(r.raw, raw);
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[2].sandbox, "/run/netns/x");
        assert_eq!(r.ips[1].address, "10.1.0.5".parse::<IpAddr>().unwrap());
        assert_eq!(r.ips[1].prefix_len, 24);
        assert_eq!(r.ips[1].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(r.routes[0].dst_prefix_len, 0);
        assert_eq!(r.routes[1].gw, Some("10.1.0.254".parse().unwrap()));
        assert_eq!(r.dns.nameservers, vec!["10.0.0.10"]);
        // The host bridge's address is not a pod IP; IPv4 leads.
        let ips: Vec<String> = r.pod_ips("eth0").iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, vec!["10.1.0.5", "fd00::5"]);
    }

    #[test]
    fn parses_a_0_3_1_result_without_interface_indices() {
        let raw = json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.22.0.7/16", "gateway": "10.22.0.1"}],
            "dns": {}
        });
        let r = CniResult::parse(raw).unwrap();
        assert_eq!(
            r.pod_ips("eth0"),
            vec!["10.22.0.7".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn rejects_malformed_results() {
        for bad in [
            json!({"ips": [{"address": "10.1.0.5"}]}),
            json!({"ips": [{"address": "10.1.0.5/33"}]}),
            json!({"ips": [{"address": "nope/24"}]}),
            json!({"ips": [{"address": "10.1.0.5/24", "interface": 3}]}),
            json!({"routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}),
            json!({"ips": "not a list"}),
        ] {
            assert!(CniResult::parse(bad.clone()).is_err(), "{bad}");
        }
    }

    /// Property tests: a plugin's output is parsed whatever it holds — no panic, and what
    /// comes out is never more than what went in (no allocation the input does not pay for).
    mod props {
        use super::*;
        use proptest::collection::vec;
        use proptest::prelude::*;

        /// Address-like strings: valid CIDRs, bare addresses, junk, huge prefixes.
        fn address() -> impl Strategy<Value = String> {
            prop_oneof![
                (any::<[u8; 4]>(), 0u16..300)
                    .prop_map(|(a, l)| format!("{}.{}.{}.{}/{l}", a[0], a[1], a[2], a[3])),
                (any::<[u16; 8]>(), 0u16..300)
                    .prop_map(|(a, l)| { format!("{}/{l}", std::net::Ipv6Addr::from(a)) }),
                any::<[u8; 4]>().prop_map(|a| format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])),
                ".{0,40}",
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                ".{0,20}".prop_map(Value::from),
                address().prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    vec(inner.clone(), 0..4).prop_map(Value::from),
                    vec(
                        (
                            prop_oneof![
                                Just("address".to_string()),
                                Just("gateway".to_string()),
                                Just("interface".to_string()),
                                Just("dst".to_string()),
                                Just("gw".to_string()),
                                Just("name".to_string()),
                                ".{0,8}"
                            ],
                            inner
                        ),
                        0..4
                    )
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        /// Results shaped like a plugin's, with hostile fields anywhere.
        fn result() -> impl Strategy<Value = Value> {
            let ip = (
                address(),
                proptest::option::of(address()),
                proptest::option::of(0usize..6),
            )
                .prop_map(|(a, g, i)| {
                    let mut m = serde_json::Map::new();
                    m.insert("address".into(), a.into());
                    if let Some(g) = g {
                        m.insert("gateway".into(), g.into());
                    }
                    if let Some(i) = i {
                        m.insert("interface".into(), i.into());
                    }
                    Value::Object(m)
                });
            let iface = (".{0,16}", ".{0,20}", ".{0,20}")
                .prop_map(|(n, mac, sb)| serde_json::json!({"name": n, "mac": mac, "sandbox": sb}));
            let route = (address(), proptest::option::of(address()))
                .prop_map(|(d, g)| serde_json::json!({"dst": d, "gw": g}));
            (
                ".{0,10}",
                vec(iface, 0..4),
                vec(ip, 0..6),
                vec(route, 0..4),
                value(),
                value(),
            )
                .prop_map(|(v, ifs, ips, routes, dns, extra)| {
                    serde_json::json!({
                        "cniVersion": v,
                        "interfaces": ifs,
                        "ips": ips,
                        "routes": routes,
                        "dns": dns,
                        "extra": extra,
                    })
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn results_parse_without_panic_and_never_grow(raw in prop_oneof![result(), value()]) {
                let n = |k: &str| raw.get(k).and_then(Value::as_array).map_or(0, Vec::len);
                if let Ok(r) = CniResult::parse(raw.clone()) {
                    prop_assert!(r.ips.len() <= n("ips"));
                    prop_assert!(r.routes.len() <= n("routes"));
                    prop_assert!(r.interfaces.len() <= n("interfaces"));
                    for ip in &r.ips {
                        let max = if ip.address.is_ipv4() { 32 } else { 128 };
                        prop_assert!(ip.prefix_len <= max);
                        prop_assert!(ip.interface.is_none_or(|i| i < r.interfaces.len()));
                    }
                    let chosen = r.pod_ips("eth0");
                    prop_assert!(chosen.len() <= r.ips.len());
                }
            }

            #[test]
            fn plugin_output_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
                // As `CniExec::add` reads a plugin's stdout: JSON first, then the result.
                if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                    let _ = CniResult::parse(v);
                }
            }
        }
    }
}
