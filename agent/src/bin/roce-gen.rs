fn main() {
    let mut l = roce_agent::loader::load(&Default::default()).unwrap();
    let fd = l.xdp_fd().unwrap();
    let mut f = vec![0u8; 74];
    f[12] = 0x08;
    f[13] = 0;
    f[14] = 0x45;
    f[15] = 0x6a;
    f[23] = 17;
    f[36] = 0x12;
    f[37] = 0xb7;
    f[38] = 0;
    f[39] = 40;
    f[42] = 0x81;
    f[46] = 0x40;
    f[49] = 0x12;
    let o = roce_agent::testrun::test_run(
        fd,
        &roce_agent::testrun::TestRun {
            data: &f,
            repeat: 1000000,
            ..Default::default()
        },
    )
    .unwrap();
    println!("{:?} {}", o.retval, o.duration_ns);
    let _ = fd;
    println!("{:?}", l.flows().unwrap());
    println!("{:?}", &l.stats().unwrap()[..10]);
}
