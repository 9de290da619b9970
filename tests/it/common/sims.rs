//! Device simulators for the real fence agents, one set per test on free loopback ports:
//! ipmi_sim (IPMI BMC), sushy-emulator (Redfish) and snmpsim (APC PDU and an IF-MIB switch).
//! Installed by `scripts/fence-sims install`; killed when dropped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

pub fn sims_dir() -> PathBuf {
    std::env::var_os("MAINTD_SIMS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo("target/sims"))
}

/// Whether the agents and simulators are installed. When they are not, the fencing tests are
/// skipped with a notice, unless MAINTD_REQUIRE_SIMS=1 (CI), which makes that a failure.
pub fn available() -> bool {
    let ok = Command::new(repo("scripts/fence-sims"))
        .arg("check")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("MAINTD_REQUIRE_SIMS").as_deref() != Ok("1"),
            "fence agents or simulators missing: run scripts/fence-sims install"
        );
        eprintln!("skipped: fence agents or simulators missing (scripts/fence-sims install)");
    }
    ok
}

pub fn free_udp_port() -> u16 {
    super::free_port()
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Proc {
    let f = std::fs::File::create(log).unwrap();
    Proc(
        cmd.stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap(),
    )
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn make_dir(p: &Path) {
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// An IPMI BMC whose chassis power is a state file.
pub struct Ipmi {
    /// The address it listens on (127.0.0.1 unless started with `start_at`).
    pub addr: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    state: PathBuf,
    proc: Option<Proc>,
}

/// `[fencing]` for `node` behind `ipmi`, by the real fence_ipmilan: fast detection, readiness
/// checks off (every agent call is a flow's), no restart, the power-off tried once; with
/// `recovery`, the BMC also powers the node back on in its recovery.
pub fn ipmi_fencing(c: &super::Cluster, ipmi: &Ipmi, node: &str, recovery: bool) -> String {
    let methods = format!(
        "timeout = \"20s\"\nmethods = [{{ template = \"ipmi\", params = {{ {} }} }}]\n",
        ipmi.params()
    );
    let mut toml = format!(
        r#"
[fencing]
check-interval = "0s"
grace = "1s"
liveness-interval = "200ms"
liveness-timeout = "500ms"
storm-percent = 50
max-restarts = 0
[fencing.templates.ipmi]
agent = "fence_ipmilan"
secrets = {{ password = "{}" }}
[fencing.nodes.{node}.power-management]
retries = 0
{methods}"#,
        c.secret("bmc.pw", &ipmi.password).display(),
    );
    if recovery {
        toml.push_str(&format!(
            "[fencing.nodes.{node}.recovery]\nretries = 1\n{methods}"
        ));
    }
    toml
}

impl Ipmi {
    pub fn start(dir: &Path, name: &str) -> Ipmi {
        Ipmi::start_in(dir, name, &[])
    }

    /// A BMC under `wrapper` (e.g. `nsenter --net=…`: 127.0.0.1 of another network namespace).
    pub fn start_in(dir: &Path, name: &str, wrapper: &[&str]) -> Ipmi {
        Ipmi::start_on(dir, name, wrapper, "127.0.0.1")
    }

    /// A BMC listening on `addr` (a bridge's address, which hosts in network namespaces reach).
    pub fn start_at(dir: &Path, name: &str, addr: &str) -> Ipmi {
        Ipmi::start_on(dir, name, &[], addr)
    }

    fn start_on(dir: &Path, name: &str, wrapper: &[&str], addr: &str) -> Ipmi {
        let command = |program: &str| match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        let d = dir.join(format!("ipmi-{name}"));
        make_dir(&d.join("state"));
        let port = free_udp_port();
        let state = d.join("power");
        std::fs::write(&state, "1\n").unwrap();
        let (user, password) = ("admin".to_string(), "s3cret".to_string());
        std::fs::write(
            d.join("lan.conf"),
            format!(
                r#"name "{name}"
set_working_mc 0x20
  startlan 1
    addr {addr} {port}
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "{} {}"
  user 2 true "{user}" "{password}" admin 10 none md2 md5 straight
"#,
                repo("tests/support/chassis").display(),
                state.display()
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("cmds.emu"),
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n",
        )
        .unwrap();
        let proc = spawn(
            command("ipmi_sim")
                .arg("-c")
                .arg(d.join("lan.conf"))
                .arg("-f")
                .arg(d.join("cmds.emu"))
                .arg("-s")
                .arg(d.join("state"))
                .arg("-n"),
            &d.join("sim.log"),
        );
        let me = Ipmi {
            addr: addr.to_string(),
            port,
            user,
            password,
            state,
            proc: Some(proc),
        };
        wait_until("ipmi_sim to answer", || {
            command("ipmitool")
                .args([
                    "-I",
                    "lanplus",
                    "-C",
                    "3",
                    "-H",
                    addr,
                    "-p",
                    &port.to_string(),
                ])
                .args([
                    "-U",
                    &me.user,
                    "-P",
                    &me.password,
                    "chassis",
                    "power",
                    "status",
                ])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        me
    }

    pub fn powered_on(&self) -> bool {
        std::fs::read_to_string(&self.state).unwrap().trim() == "1"
    }

    /// Makes the BMC accept "off" but stay on.
    pub fn set_stuck(&self) {
        std::fs::write(self.state.with_extension("stuck"), "").unwrap();
    }

    /// Makes the BMC lie: it reports what it was told (OFF) and switches nothing.
    pub fn set_lying(&self) {
        std::fs::write(self.state.with_extension("lie"), "").unwrap();
    }

    /// The node behind this BMC does not boot when powered on.
    pub fn set_no_boot(&self) {
        std::fs::write(self.state.with_extension("noboot"), "").unwrap();
    }

    /// The power state file a stand-in node follows (tests/support/powered-node).
    pub fn state_file(&self) -> &Path {
        &self.state
    }

    /// How many times the device was told to switch the power off (by anyone, ever): the
    /// chassis writes each command it is given next to the state file.
    pub fn power_offs(&self) -> usize {
        std::fs::read_to_string(self.state.with_extension("calls"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("power 0"))
            .count()
    }

    /// A dead BMC: nothing answers on its port any more.
    pub fn kill(&mut self) {
        self.proc = None;
    }

    /// The method parameters for fence_ipmilan (password as given, so tests can make it wrong).
    pub fn params(&self) -> String {
        format!(
            r#"ip = "{}", ipport = "{}", username = "{}", lanplus = "1", cipher = "3", power_wait = "0""#,
            self.addr, self.port, self.user
        )
    }
}

/// snmpsim serving an APC rack PDU (community `apc`) and a switch (community `switch`).
pub struct Snmp {
    pub port: u16,
    dir: PathBuf,
    _proc: Proc,
}

impl Snmp {
    pub fn start(dir: &Path) -> Snmp {
        let d = dir.join("snmp");
        make_dir(&d.join("data"));
        make_dir(&d.join("cache"));
        make_dir(&d.join("outlets"));
        let outlet = repo("tests/support/outlet");
        let mut apc = String::from("1.3.6.1.2.1.1.2.0|6|1.3.6.1.4.1.318.1.3.4.5\n");
        for n in 1..=4 {
            apc.push_str(&format!(
                "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4.{n}|2:subprocess|{} {}/{n} @SETFLAG@ @ORIGVALUE@\n",
                outlet.display(),
                d.join("outlets").display()
            ));
        }
        for n in 1..=4 {
            apc.push_str(&format!(
                "1.3.6.1.4.1.318.1.1.12.3.5.1.1.2.{n}|4|outlet{n}\n"
            ));
        }
        for n in 1..=4 {
            apc.push_str(&format!(
                "1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.{n}|2:subprocess|{} {}/{n} 0 0\n",
                outlet.display(),
                d.join("outlets").display()
            ));
        }
        std::fs::write(d.join("data/apc.snmprec"), apc).unwrap();
        let mut sw = String::new();
        for n in 1..=4 {
            sw.push_str(&format!("1.3.6.1.2.1.2.2.1.2.{n}|4|port{n}\n"));
        }
        for n in 1..=4 {
            sw.push_str(&format!("1.3.6.1.2.1.2.2.1.7.{n}|2:writecache|value=1\n"));
        }
        std::fs::write(d.join("data/switch.snmprec"), sw).unwrap();
        for n in 1..=4 {
            std::fs::write(d.join(format!("outlets/{n}")), "1\n").unwrap();
            std::fs::set_permissions(
                d.join(format!("outlets/{n}")),
                std::fs::Permissions::from_mode(0o666),
            )
            .unwrap();
        }
        let port = free_udp_port();
        let mut cmd = Command::new(sims_dir().join("venv-snmp/bin/snmpsim-command-responder"));
        cmd.arg(format!("--data-dir={}", d.join("data").display()))
            .arg(format!("--cache-dir={}", d.join("cache").display()))
            .arg(format!("--agent-udpv4-endpoint=127.0.0.1:{port}"));
        if nix::unistd::geteuid().is_root() {
            cmd.args(["--process-user=nobody", "--process-group=nogroup"]);
        }
        let proc = spawn(&mut cmd, &d.join("sim.log"));
        let me = Snmp {
            port,
            dir: d,
            _proc: proc,
        };
        wait_until("snmpsim to answer", || {
            me.get("switch", "1.3.6.1.2.1.2.2.1.7.1").is_some()
        });
        me
    }

    fn get(&self, community: &str, oid: &str) -> Option<i64> {
        let out = Command::new("snmpget")
            .args(["-v1", "-c", community, "-Oqv", "-t", "1", "-r", "0"])
            .arg(format!("127.0.0.1:{}", self.port))
            .arg(oid)
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    /// APC outlet state: true when on.
    pub fn outlet_on(&self, n: u32) -> bool {
        std::fs::read_to_string(self.dir.join(format!("outlets/{n}")))
            .unwrap()
            .trim()
            == "1"
    }

    /// Switch port admin status: true when up.
    pub fn port_up(&self, n: u32) -> bool {
        self.get("switch", &format!("1.3.6.1.2.1.2.2.1.7.{n}")) == Some(1)
    }
}

/// sushy-emulator with the fake driver (no delay) serving one system over HTTPS.
pub struct Redfish {
    pub port: u16,
    pub uuid: String,
    proc: Proc,
}

impl Redfish {
    pub fn start(dir: &Path) -> Redfish {
        let d = dir.join("redfish");
        make_dir(&d.join("state"));
        let port = crate::common::free_port();
        let uuid = "a3a7d9a2-4ad1-4c3f-9a1e-1c2a0a0c0de1".to_string();
        let ok = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
            ])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(d.join("key.pem"))
            .arg("-out")
            .arg(d.join("cert.pem"))
            .output()
            .unwrap();
        assert!(ok.status.success(), "{ok:?}");
        std::fs::write(
            d.join("sushy.conf"),
            format!(
                r#"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'
SUSHY_EMULATOR_LISTEN_PORT = {port}
SUSHY_EMULATOR_SSL_CERT = '{cert}'
SUSHY_EMULATOR_SSL_KEY = '{key}'
SUSHY_EMULATOR_FAKE_DRIVER = True
SUSHY_EMULATOR_STATE_DIR = '{state}'
SUSHY_EMULATOR_FAKE_SYSTEMS = [{{'uuid': '{uuid}', 'name': 'node', 'power_state': 'On', 'nics': []}}]
"#,
                cert = d.join("cert.pem").display(),
                key = d.join("key.pem").display(),
                state = d.join("state").display(),
            ),
        )
        .unwrap();
        let proc = spawn(
            Command::new(sims_dir().join("venv-sushy/bin/python"))
                .arg(repo("tests/support/sushy-fast.py"))
                .arg("--config")
                .arg(d.join("sushy.conf")),
            &d.join("sim.log"),
        );
        let me = Redfish { port, uuid, proc };
        wait_until("sushy-emulator to answer", || me.power_state().is_some());
        me
    }

    pub fn power_state(&self) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sk", "--max-time", "2"])
            .arg(format!(
                "https://127.0.0.1:{}/redfish/v1/Systems/{}",
                self.port, self.uuid
            ))
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["PowerState"].as_str().map(String::from)
    }

    /// Freezes the server (SIGSTOP): requests hang forever.
    pub fn hang(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.proc.0.id() as i32),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
    }

    pub fn params(&self) -> String {
        format!(
            r#"ip = "127.0.0.1", ipport = "{}", username = "admin", ssl_insecure = "1", systems_uri = "/redfish/v1/Systems/{}", power_wait = "0""#,
            self.port, self.uuid
        )
    }
}

/// A stand-in node whose life follows its BMC's power state (tests/support/powered-node): off
/// kills its collector, on starts it again with a new boot id. Killed when dropped: the
/// node's loop dies by SIGKILL, which it cannot pass on to the collector.
pub struct PoweredNode {
    /// Matches the collector process, not the loop (whose arguments hold the same path).
    pattern: String,
}

impl PoweredNode {
    pub fn start(c: &mut super::Cluster, i: usize, ipmi: &Ipmi) -> PoweredNode {
        let node = repo("tests/support/powered-node").display().to_string();
        let state = ipmi.state_file().display().to_string();
        let boot = c.boot_file(i).display().to_string();
        c.start_collector_wrapped(i, &[node.as_str(), state.as_str(), boot.as_str()]);
        let cfg = c.path(&format!("collector-{}.toml", c.nodes[i]));
        PoweredNode {
            pattern: format!("^[^ ]*/maintd --config {}", cfg.display()),
        }
    }

    /// The node's collector hangs (`true`: a hung kernel, powered but silent) or runs again.
    pub fn hang(&self, on: bool) {
        let ok = Command::new("pkill")
            .args([if on { "-STOP" } else { "-CONT" }, "-f", &self.pattern])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "no collector to signal ({})", self.pattern);
    }
}

impl Drop for PoweredNode {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &self.pattern])
            .status();
    }
}
