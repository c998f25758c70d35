//! `toolgate tools import` (DESIGN §11.5) through the real binary: contracts from a
//! `tools/list` file, byte for byte; a changed server shown as a diff and written only with
//! `--force`; refused names writing nothing; and a live MCP server of the official Python SDK
//! (`tests/it/fixtures/mcp/server.py`) over stdio and over Streamable HTTP, its three pages
//! followed through `nextCursor`. Every written folder loads with `toolgate check`.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::prerequisites;
use crate::support::fixture;

/// The four contracts `fixtures/mcp/tools_list.json` gives.
const FILE_TOOLS: [&str; 4] = [
    "get_order",
    "update_preferences",
    "send_email",
    "delete_account",
];

fn toolgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .env_remove("TOOLGATE_POLICIES")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A policy folder with no tools yet: a schema declaring `Order` and a policy that permits
/// every read, so the imported contracts are all it needs to load.
fn empty_policies() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("policies");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("schema.cedarschema"), "entity Order;\n").unwrap();
    std::fs::write(
        dir.join("reads.cedar"),
        "permit (principal, action in Action::\"risk:read\", resource);\n",
    )
    .unwrap();
    (tmp, dir)
}

fn import(dir: &Path, source: &[&str], flags: &[&str]) -> (i32, String, String) {
    let mut args = vec!["tools", "import", "--policies", dir.to_str().unwrap()];
    args.extend_from_slice(flags);
    args.extend_from_slice(source);
    toolgate(&args)
}

fn file_source(path: &Path) -> Vec<String> {
    vec!["--file".to_owned(), path.to_str().unwrap().to_owned()]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Every file of `<dir>/tools`, name → bytes.
fn tools_folder(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("tools"))
        .map(|entries| {
            entries
                .map(|entry| {
                    let path = entry.unwrap().path();
                    let name = path.file_name().unwrap().to_str().unwrap().to_owned();
                    (name, std::fs::read(&path).unwrap())
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn check_loads(dir: &Path, tools: usize) {
    let (code, out, err) = toolgate(&["check", "--policies", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with(&format!("ok: {tools} tools, 1 policies")),
        "{out}"
    );
}

#[test]
fn a_tools_list_file_becomes_exact_contracts_that_load() {
    let (_tmp, dir) = empty_policies();
    let list = fixture("mcp/tools_list.json");
    let (code, out, err) = import(&dir, &strs(&file_source(&list)), &[]);
    assert_eq!(code, 0, "{out}{err}");
    let tools = dir.join("tools");
    let expected_out = format!(
        "created: {0}/get_order.json (risk read; resource: null (set it if the tool acts on one))\n\
         created: {0}/update_preferences.json (risk write; resource: null (set it if the tool acts on one))\n\
         created: {0}/send_email.json (risk external; resource: null (set it if the tool acts on one))\n\
         created: {0}/delete_account.json (risk destructive; resource: null (set it if the tool acts on one))\n\
         4 tool(s): 4 created, 0 unchanged, 0 updated, 0 differ and not written\n",
        tools.display()
    );
    assert_eq!(out, expected_out);
    assert_eq!(err, "");
    let mut expected: Vec<_> = FILE_TOOLS
        .iter()
        .map(|name| {
            let file = format!("{name}.json");
            let bytes = std::fs::read(fixture(&format!("mcp/contracts/{file}"))).unwrap();
            (file, bytes)
        })
        .collect();
    expected.sort();
    assert_eq!(tools_folder(&dir), expected);
    check_loads(&dir, 4);

    // The same list again changes nothing.
    let (code, out, err) = import(&dir, &strs(&file_source(&list)), &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("unchanged: ").count(), 4, "{out}");
    assert!(
        out.ends_with("4 tool(s): 0 created, 4 unchanged, 0 updated, 0 differ and not written\n"),
        "{out}"
    );
    assert_eq!(tools_folder(&dir), expected);
}

#[test]
fn a_changed_contract_is_a_diff_written_only_with_force() {
    let (tmp, dir) = empty_policies();
    let list = fixture("mcp/tools_list.json");
    let (code, out, err) = import(&dir, &strs(&file_source(&list)), &[]);
    assert_eq!(code, 0, "{out}{err}");

    // The author fills in get_order's resource and timeout: a re-import keeps them.
    let get_order = dir.join("tools/get_order.json");
    let authored = std::fs::read_to_string(&get_order)
        .unwrap()
        .replace(
            "\"resource\": null",
            "\"resource\": {\n    \"type\": \"Order\",\n    \"idPointer\": \"/order_id\"\n  }",
        )
        .replace("\"timeoutMs\": 30000", "\"timeoutMs\": 1500");
    std::fs::write(&get_order, &authored).unwrap();

    // The server now bounds order_id's length.
    let changed = tmp.path().join("changed.json");
    let text = std::fs::read_to_string(&list).unwrap().replace(
        "\"order_id\": { \"type\": \"string\" }",
        "\"order_id\": { \"type\": \"string\", \"maxLength\": 64 }",
    );
    assert!(text.contains("maxLength"));
    std::fs::write(&changed, text).unwrap();
    let before = tools_folder(&dir);

    let diff = "--- a/tools/get_order.json\n\
                +++ b/tools/get_order.json\n\
                @@ -14,7 +14,8 @@\n     \
                \"type\": \"object\",\n     \
                \"properties\": {\n       \
                \"order_id\": {\n\
                -        \"type\": \"string\"\n\
                +        \"type\": \"string\",\n\
                +        \"maxLength\": 64\n       \
                }\n     \
                },\n     \
                \"required\": [\n";
    let line = |verb: &str| {
        format!(
            "{verb}: {}/get_order.json (risk read)\n",
            dir.join("tools").display()
        )
    };
    let (code, out, err) = import(&dir, &strs(&file_source(&changed)), &[]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.starts_with(diff), "{out}");
    assert!(out.contains(&line("differs, not written")), "{out}");
    assert!(
        out.ends_with(
            "4 tool(s): 0 created, 3 unchanged, 0 updated, 1 differ and not written\n\
             review the diff above; --force writes it\n"
        ),
        "{out}"
    );
    assert_eq!(
        tools_folder(&dir),
        before,
        "nothing written without --force"
    );

    // A dry run exits as the import would, and writes nothing.
    let (code, out, err) = import(&dir, &strs(&file_source(&changed)), &["--dry-run"]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.starts_with(diff), "{out}");
    assert!(
        out.ends_with("dry run: nothing was written\nreview the diff above; --force writes it\n"),
        "{out}"
    );
    assert_eq!(tools_folder(&dir), before);

    // A dry run with --force says what it would do, and writes nothing.
    let (code, out, err) = import(
        &dir,
        &strs(&file_source(&changed)),
        &["--force", "--dry-run"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with(diff), "{out}");
    assert!(out.contains(&line("would update")), "{out}");
    assert!(out.ends_with("dry run: nothing was written\n"), "{out}");
    assert_eq!(tools_folder(&dir), before);

    let (code, out, err) = import(&dir, &strs(&file_source(&changed)), &["--force"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&line("updated")), "{out}");
    let written = std::fs::read_to_string(&get_order).unwrap();
    assert_eq!(
        written,
        authored.replace(
            "        \"type\": \"string\"\n",
            "        \"type\": \"string\",\n        \"maxLength\": 64\n"
        )
    );
    check_loads(&dir, 4);
    // Only get_order changed.
    let after = tools_folder(&dir);
    assert_eq!(after.len(), before.len());
    for ((name, old), (_, new)) in before.iter().zip(&after) {
        assert_eq!(old == new, name != "get_order.json", "{name}");
    }
}

#[test]
fn a_refused_name_or_bad_input_writes_nothing() {
    let (tmp, dir) = empty_policies();
    let cases = [
        (
            r#"{"tools": [{"name": "ok", "inputSchema": {"type": "object"}},
                          {"name": "../../escape", "inputSchema": {"type": "object"}}]}"#,
            "toolgate: error[invalid_tool_name]: tool name \"../../escape\" is not a valid \
             toolgate tool name (`^[A-Za-z0-9_-]{1,64}$`); nothing was imported\n",
        ),
        (
            r#"{"tools": [{"name": "a", "inputSchema": {"type": "object"}},
                          {"name": "a", "inputSchema": {"type": "object"}}]}"#,
            "toolgate: error[duplicate_tool]: tool name \"a\" is listed twice\n",
        ),
        (
            r#"{"tools": [], "tools": []}"#,
            "toolgate: error[invalid_json]: the tools/list document is not acceptable JSON: \
             duplicate object key `/tools` at byte 14\n",
        ),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no"}}"#,
            "toolgate: error[mcp_server_error]: the MCP server answered tools/list with error \
             -32601: \"no\"\n",
        ),
    ];
    for (document, expected) in cases {
        let path = tmp.path().join("list.json");
        std::fs::write(&path, document).unwrap();
        let (code, out, err) = import(&dir, &strs(&file_source(&path)), &[]);
        assert_eq!((code, out.as_str(), err.as_str()), (1, "", expected));
        assert_eq!(tools_folder(&dir), vec![]);
    }
    let (code, _, err) = import(&dir, &["--file", "/nonexistent/list.json"], &[]);
    assert_eq!(code, 1);
    assert!(err.starts_with("toolgate: error[read_failed]: "), "{err}");
}

#[test]
fn a_file_holding_one_page_of_several_is_imported_with_a_warning() {
    let (tmp, dir) = empty_policies();
    let path = tmp.path().join("page.json");
    std::fs::write(
        &path,
        r#"{"tools": [{"name": "a", "inputSchema": {"type": "object"}}], "nextCursor": "2"}"#,
    )
    .unwrap();
    let (code, out, err) = import(&dir, &strs(&file_source(&path)), &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.ends_with(
            "1 tool(s): 1 created, 0 unchanged, 0 updated, 0 differ and not written\n\
             warning: the file holds one page of the list (it has a nextCursor); \
             import from the server to get every tool\n"
        ),
        "{out}"
    );
    assert_eq!(tools_folder(&dir).len(), 1);
}

/// The risk each tool of `server.py` declares through its annotations.
const SERVER_TOOLS: [(&str, &str, bool); 5] = [
    ("delete_account", "destructive", false),
    ("get_order", "read", false),
    ("purge_cache", "destructive", false),
    ("send_email", "external", false),
    ("update_preferences", "write", true),
];

/// Checks the contracts a live import of `server.py` wrote, and returns them.
fn check_server_contracts(dir: &Path, out: &str) -> Vec<(String, Vec<u8>)> {
    assert!(
        out.ends_with("5 tool(s): 5 created, 0 unchanged, 0 updated, 0 differ and not written\n"),
        "{out}"
    );
    let files = tools_folder(dir);
    let names: Vec<_> = files.iter().map(|(name, _)| name.clone()).collect();
    let expected: Vec<_> = SERVER_TOOLS
        .iter()
        .map(|(name, _, _)| format!("{name}.json"))
        .collect();
    assert_eq!(names, expected);
    for ((_, bytes), (name, risk, idempotent)) in files.iter().zip(SERVER_TOOLS) {
        let contract: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(contract["name"], *name);
        assert_eq!(contract["risk"], risk, "{name}");
        assert_eq!(contract["idempotent"], idempotent, "{name}");
        assert_eq!(contract["resource"], serde_json::Value::Null);
        assert_eq!(contract["inputSchema"]["type"], "object", "{name}");
        assert_eq!(contract["outputSchema"]["type"], "object", "{name}");
    }
    let get_order: serde_json::Value = serde_json::from_slice(&files[1].1).unwrap();
    assert_eq!(get_order["description"], "Look up an order.");
    assert_eq!(
        get_order["inputSchema"]["required"],
        serde_json::json!(["order_id"])
    );
    assert_eq!(
        get_order["inputSchema"]["properties"]["order_id"]["type"],
        "string"
    );
    check_loads(dir, 5);
    files
}

#[test]
fn a_live_mcp_server_over_stdio_and_streamable_http_gives_the_same_contracts() {
    let Some(py) = prerequisites::python_with_mcp() else {
        return;
    };
    let server = fixture("mcp/server.py");
    let server = server.to_str().unwrap();

    let (_stdio_tmp, stdio_dir) = empty_policies();
    let (code, out, err) = import(&stdio_dir, &["--", &py, server, "stdio"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let over_stdio = check_server_contracts(&stdio_dir, &out);

    let port = free_port();
    let mut child = ServerProcess(
        Command::new(&py)
            .args([server, "http", &port.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port, &mut child.0);
    let (_http_tmp, http_dir) = empty_policies();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let (code, out, err) = import(&http_dir, &["--url", &url], &["--timeout-seconds", "20"]);
    assert_eq!(code, 0, "{out}{err}");
    let over_http = check_server_contracts(&http_dir, &out);
    assert_eq!(over_http, over_stdio);

    // The same server again: every contract unchanged.
    let (code, out, err) = import(&http_dir, &["--url", &url], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("unchanged: ").count(), 5, "{out}");
    drop(child);

    // A server that is gone is an error that names it, and writes nothing.
    let (_gone_tmp, gone_dir) = empty_policies();
    let (code, out, err) = import(&gone_dir, &["--url", &url], &["--timeout-seconds", "5"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.starts_with("toolgate: error[mcp_unreachable]: "),
        "{err}"
    );
    assert_eq!(tools_folder(&gone_dir), vec![]);
}

#[test]
fn a_bearer_token_is_read_from_the_variable_named() {
    let Some(py) = prerequisites::python_with_mcp() else {
        return;
    };
    let server = fixture("mcp/server.py");
    let port = free_port();
    let token = "import-test-token";
    let mut child = ServerProcess(
        Command::new(&py)
            .args([server.to_str().unwrap(), "http", &port.to_string()])
            .env("MCP_TEST_BEARER_TOKEN", token)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_port(port, &mut child.0);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let (_tmp, dir) = empty_policies();
    let dir_arg = dir.to_str().unwrap();
    let with_token = |value: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        command.args(["tools", "import", "--policies", dir_arg, "--url", &url]);
        command.args(["--bearer-token-env", "IMPORT_TEST_TOKEN"]);
        match value {
            Some(value) => command.env("IMPORT_TEST_TOKEN", value),
            None => command.env_remove("IMPORT_TEST_TOKEN"),
        };
        let out = command.output().unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };

    let (code, out, err) = with_token(None);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            1,
            "",
            "toolgate: --bearer-token-env: `IMPORT_TEST_TOKEN` is not set: environment variable not found\n"
        )
    );
    let (code, out, err) = with_token(Some("wrong"));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.starts_with("toolgate: error[mcp_unreachable]: "),
        "{err}"
    );
    assert!(err.contains("Auth required"), "{err}");
    assert!(!err.contains("wrong"), "the token is never printed: {err}");
    assert_eq!(tools_folder(&dir), vec![]);

    let (code, out, err) = with_token(Some(token));
    assert_eq!(code, 0, "{out}{err}");
    check_server_contracts(&dir, &out);
}

#[test]
fn a_server_command_that_cannot_start_is_an_error() {
    let (_tmp, dir) = empty_policies();
    let (code, out, err) = import(&dir, &["--", "/nonexistent/mcp-server"], &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.starts_with(
            "toolgate: error[mcp_unreachable]: cannot start the MCP server `/nonexistent/mcp-server`: "
        ),
        "{err}"
    );
    assert_eq!(tools_folder(&dir), vec![]);
}

#[test]
fn a_server_that_never_answers_times_out_and_is_stopped() {
    let (tmp, dir) = empty_policies();
    let pid_file = tmp.path().join("server.pid");
    let script = format!("echo $$ > '{}'; exec sleep 600", pid_file.display());
    let started = Instant::now();
    let (code, out, err) = import(
        &dir,
        &["--", "sh", "-c", &script],
        &["--timeout-seconds", "1"],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        err,
        "toolgate: error[mcp_timeout]: the MCP server did not answer initialize within 1 s\n"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(tools_folder(&dir), vec![]);
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let proc = PathBuf::from(format!("/proc/{}", pid.trim()));
    let deadline = Instant::now() + Duration::from_secs(10);
    // Killed; `/proc/<pid>` goes once init has reaped it (a zombie reads state Z).
    while proc.exists()
        && !std::fs::read_to_string(proc.join("stat")).is_ok_and(|stat| stat.contains(") Z "))
    {
        assert!(
            Instant::now() < deadline,
            "the server {} still runs",
            pid.trim()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The HTTP server child, killed and reaped when dropped.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (at most 30 s) until the server accepts connections on `port`.
fn wait_for_port(port: u16, child: &mut Child) {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the MCP server exited before listening: {status}");
        }
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the MCP server did not listen on {port} within 30 s");
}
