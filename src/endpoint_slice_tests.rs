use super::*;

fn cfg(ip: &str) -> SliceConfig {
    SliceConfig {
        service: "db".into(),
        namespace: "billing".into(),
        pod: "db-0".into(),
        pod_ip: ip.parse().unwrap(),
        node: Some("node-a".into()),
    }
}

#[test]
fn service_names_are_rfc_1035_labels() {
    for ok in ["db", "a-1", &"a".repeat(63)] {
        assert!(check_service_name(ok).is_ok(), "{ok}");
    }
    for bad in ["", "1db", "db-", "DB", "d_b", "d.b", &"a".repeat(64)] {
        assert!(check_service_name(bad).is_err(), "{bad}");
    }
}

#[test]
fn ports_are_the_services_target_ports_with_names_and_protocols() {
    let svc = json!({"spec": {"ports": [
        {"name": "http", "port": 80, "targetPort": 8080},
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "grpc", "port": 90, "targetPort": "9090", "appProtocol": "grpc"},
    ]}});
    assert_eq!(
        slice_ports(&svc).unwrap(),
        vec![
            json!({"name": "http", "port": 8080, "protocol": "TCP"}),
            json!({"name": "dns", "port": 53, "protocol": "UDP"}),
            json!({"name": "grpc", "port": 9090, "protocol": "TCP", "appProtocol": "grpc"}),
        ]
    );
    let named = json!({"spec": {"ports": [{"port": 80, "targetPort": "http"}]}});
    let e = slice_ports(&named).unwrap_err();
    assert!(e.contains("targetPort") && e.contains("number"), "{e}");
    assert!(slice_ports(&json!({"spec": {}})).is_err());
}

#[test]
fn the_leaders_slice_names_its_pod_alone_and_the_emptied_one_nobody() {
    let c = cfg("10.1.2.3");
    let ports = vec![json!({"name": "http", "port": 8080, "protocol": "TCP"})];
    let s = slice_body(&c, "uid-1", &ports, true);
    assert_eq!(s["metadata"]["name"], "db-leader-elector");
    assert_eq!(s["metadata"]["labels"]["kubernetes.io/service-name"], "db");
    assert_eq!(
        s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
        "leader-elector"
    );
    assert_eq!(s["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(s["addressType"], "IPv4");
    assert_eq!(s["endpoints"][0]["targetRef"]["name"], "db-0");
    assert_eq!(s["endpoints"][0]["nodeName"], "node-a");
    assert!(names_only(&c, &s));
    let empty = slice_body(&c, "uid-1", &ports, false);
    assert!(named_addresses(&empty).is_empty());
    assert!(!names_only(&c, &empty));
    assert_eq!(
        slice_body(&cfg("fd00::1"), "u", &ports, true)["addressType"],
        "IPv6"
    );
    // Another Pod beside ours is not "ours alone".
    let mut two = s.clone();
    two["endpoints"][0]["addresses"] = json!(["10.1.2.3", "10.9.9.9"]);
    assert!(!names_only(&c, &two));
}
