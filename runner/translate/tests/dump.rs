mod common;

#[test]
#[ignore]
fn dump_all() {
    for name in ["create_map_gbk","side_inputs","stateful_timers","stateful_custom_key","sdf","read_text","flatten_twice","combine_batch","combine_streaming","combine_after_count_streaming","windowing","custom_windows","side_input_downstream","flatten_gbk_output"] {
        let t = refract_translate::translate(&common::load(name), &common::opts());
        match t {
            Ok(t) => { println!("== {name}\n{}", common::describe(&t)); common::check_invariants(&t); }
            Err(e) => println!("== {name}: ERROR {e}"),
        }
    }
}

#[test]
#[ignore]
fn dump_pbd() {
    use refract_proto::prost::Message;
    let name = std::env::var("PIPE").unwrap();
    let stage: usize = std::env::var("STAGE").unwrap().parse().unwrap();
    let t = refract_translate::translate(&common::load(&name), &common::opts()).unwrap();
    let d = &t.sdk_stages[&stage];
    let p = &d.descriptor;
    println!("id={} env={} input={:?} outputs={:?} timers={:?}", p.id, d.environment_id, d.input_transform_id, d.outputs, d.timer_families);
    println!("state={:?} timer={:?}", p.state_api_service_descriptor, p.timer_api_service_descriptor);
    for (id, tr) in &p.transforms {
        let spec = tr.spec.clone().unwrap_or_default();
        let mut extra = String::new();
        if spec.urn.contains("runner") { extra = format!("{:?}", common::port(tr)); }
        if spec.urn.contains("pardo") || spec.urn.contains("sdf") {
            let pp = refract_proto::pipeline::ParDoPayload::decode(spec.payload.as_slice()).unwrap();
            extra = format!("timers={:?} rc={}", pp.timer_family_specs.iter().map(|(k,v)| (k.clone(), v.timer_family_coder_id.clone())).collect::<Vec<_>>(), pp.restriction_coder_id);
        }
        println!("T {id} [{}] {} in={:?} out={:?} {extra}", tr.unique_name, spec.urn, tr.inputs, tr.outputs);
    }
    for (id, pc) in &p.pcollections { println!("P {id} coder={} ws={}", pc.coder_id, pc.windowing_strategy_id); }
    for (id, c) in &p.coders { println!("C {id} {} {:?}", c.spec.clone().unwrap_or_default().urn, c.component_coder_ids); }
    for (i, pc) in t.plan.pcollections.iter().enumerate() { println!("plan {i} {} {:?} {:?} {}", pc.id, pc.value_coder, pc.window_coder, pc.bounded); }
    if let refract_engine::plan::StageKind::Sdk(s) = &t.plan.stages[stage].kind { println!("{:?}", s.timer_families); }
}
