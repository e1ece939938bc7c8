//! What the programs are told to do: CONFIG, QOS and POLICY written a generation at
//! a time (a packet sees the old policy or the new one, never a mix), and what the
//! tc programs do per interface (IFACE_QOS_DIRECT, IFACE_QOS).

use aya::maps::{Array, HashMap, MapData, MapError};
use roce_common::config::{Generation, RuntimeConfig, GENERATIONS, LAYOUT_VERSION};
use roce_common::names::map;
use roce_common::policy::{DscpEntry, IfaceQos, Policy, QosConfig, DSCP_COUNT, IFACE_DIRECT};

use super::{map_error, typed_map, typed_map_mut, LoadError, Loaded};

impl Loaded {
    /// The generation the programs read now.
    fn generation(&self) -> Result<Generation, LoadError> {
        let g: Array<&MapData, Generation> = typed_map(&self.ebpf, map::GENERATION)?;
        g.get(&0, 0).map_err(map_error(map::GENERATION))
    }

    /// The policy the programs read now, its runtime configuration in `config`.
    pub fn active(&self) -> Result<Policy, LoadError> {
        let g = self.generation()?.active % GENERATIONS;
        let config: Array<&MapData, RuntimeConfig> = typed_map(&self.ebpf, map::CONFIG)?;
        let qos: Array<&MapData, QosConfig> = typed_map(&self.ebpf, map::QOS)?;
        let table: Array<&MapData, DscpEntry> = typed_map(&self.ebpf, map::POLICY)?;
        let mut policy = Policy {
            config: config.get(&g, 0).map_err(map_error(map::CONFIG))?,
            qos: qos.get(&g, 0).map_err(map_error(map::QOS))?,
            ..Policy::default()
        };
        for (dscp, entry) in policy.table.iter_mut().enumerate() {
            *entry = table
                .get(&(g * DSCP_COUNT + dscp as u32), 0)
                .map_err(map_error(map::POLICY))?;
        }
        Ok(policy)
    }

    /// Writes `config` and `policy` (its QOS and DSCP table) into the generation the
    /// programs do not read, then switches GENERATION to it: a packet sees the old
    /// policy or the new one, never a mix. (Two commits closer together than one
    /// packet's run could still meet one; commits come from a person or a file.)
    pub fn commit(&mut self, config: &RuntimeConfig, policy: &Policy) -> Result<(), LoadError> {
        let next = (self.generation()?.active + 1) % GENERATIONS;
        let mut c: Array<&mut MapData, RuntimeConfig> = typed_map_mut(&mut self.ebpf, map::CONFIG)?;
        c.set(next, *config, 0).map_err(map_error(map::CONFIG))?;
        let mut qos: Array<&mut MapData, QosConfig> = typed_map_mut(&mut self.ebpf, map::QOS)?;
        qos.set(next, policy.qos, 0).map_err(map_error(map::QOS))?;
        let mut table: Array<&mut MapData, DscpEntry> = typed_map_mut(&mut self.ebpf, map::POLICY)?;
        for (dscp, entry) in policy.table.iter().enumerate() {
            table
                .set(next * DSCP_COUNT + dscp as u32, *entry, 0)
                .map_err(map_error(map::POLICY))?;
        }
        let mut g: Array<&mut MapData, Generation> =
            typed_map_mut(&mut self.ebpf, map::GENERATION)?;
        let generation = Generation {
            active: next,
            layout: LAYOUT_VERSION,
        };
        g.set(0, generation, 0).map_err(map_error(map::GENERATION))
    }

    /// Writes the host QoS policy (QOS and POLICY); the runtime configuration stays.
    pub fn set_policy(&mut self, policy: &Policy) -> Result<(), LoadError> {
        let config = self.active()?.config;
        self.commit(&config, policy)
    }

    /// Writes CONFIG: the programs read it on their next packet (e.g. a new
    /// `events_sample`); the policy stays.
    pub fn set_config(&mut self, config: &RuntimeConfig) -> Result<(), LoadError> {
        let policy = self.active()?;
        self.commit(config, &policy)
    }

    /// Sets what the tc programs do on interface `ifindex` (None: nothing): in
    /// IFACE_QOS_DIRECT below `IFACE_DIRECT`, in the IFACE_QOS hash above.
    pub fn set_iface_qos(&mut self, ifindex: u32, qos: Option<IfaceQos>) -> Result<(), LoadError> {
        if ifindex < IFACE_DIRECT {
            let mut direct: Array<&mut MapData, IfaceQos> =
                typed_map_mut(&mut self.ebpf, map::IFACE_QOS_DIRECT)?;
            return direct
                .set(ifindex, qos.unwrap_or_default(), 0)
                .map_err(map_error(map::IFACE_QOS_DIRECT));
        }
        let mut ifaces: HashMap<&mut MapData, u32, IfaceQos> =
            typed_map_mut(&mut self.ebpf, map::IFACE_QOS)?;
        match qos {
            Some(q) => ifaces
                .insert(ifindex, q, 0)
                .map_err(map_error(map::IFACE_QOS)),
            None => match ifaces.remove(&ifindex) {
                Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
                Err(source) => Err(map_error(map::IFACE_QOS)(source)),
            },
        }
    }

    /// The interfaces IFACE_QOS_DIRECT and IFACE_QOS give something to do.
    pub fn iface_qos_indexes(&self) -> Result<Vec<u32>, LoadError> {
        let direct: Array<&MapData, IfaceQos> = typed_map(&self.ebpf, map::IFACE_QOS_DIRECT)?;
        let mut out = Vec::new();
        for i in 0..IFACE_DIRECT {
            let q = direct
                .get(&i, 0)
                .map_err(map_error(map::IFACE_QOS_DIRECT))?;
            if !q.is_off() {
                out.push(i);
            }
        }
        let hashed: HashMap<&MapData, u32, IfaceQos> = typed_map(&self.ebpf, map::IFACE_QOS)?;
        for key in hashed.keys() {
            out.push(key.map_err(map_error(map::IFACE_QOS))?);
        }
        Ok(out)
    }
}
