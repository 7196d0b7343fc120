//! Which servers `lockctl` talks to: the `--url`, `--cluster` or `--sentinel` flags, else the
//! environment that `LockerBuilder::from_env` reads, else the local default server.

use lock_runtime::{Locker, LockerBuilder};

/// What read-only commands use when nothing names a server.
pub(crate) const LOCAL: &str = "redis://127.0.0.1:6379";

/// The variables that name a server; `LOCK_REDIS_SENTINEL_MASTER` and `LOCK_REDIS_REPLICAS`
/// alone do not.
const SERVER_VARS: [&str; 4] = [
    "LOCK_REDIS_CLUSTER",
    "LOCK_REDIS_SENTINELS",
    "LOCK_REDIS_URL",
    "REDIS_URL",
];

/// A deployment named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// One server, or Redlock over several.
    Servers(Vec<String>),
    Cluster(Vec<String>),
    Sentinel {
        urls: Vec<String>,
        master: String,
    },
}

/// The deployment flags as given, checked against each other by [`Flags::target`].
#[derive(Debug, Default)]
pub(crate) struct Flags {
    urls: Vec<String>,
    cluster: Vec<String>,
    sentinels: Vec<String>,
    master: Option<String>,
}

impl Flags {
    /// Takes `flag` when it is a deployment flag, reading its value with `value`.
    pub(crate) fn take(
        &mut self,
        flag: &str,
        value: impl FnOnce(&str) -> Result<String, String>,
    ) -> Result<bool, String> {
        let list = match flag {
            "--url" => &mut self.urls,
            "--cluster" => &mut self.cluster,
            "--sentinel" => &mut self.sentinels,
            "--master" => {
                self.master = Some(value("a master name")?);
                return Ok(true);
            }
            _ => return Ok(false),
        };
        let given = value("a URL")?;
        let before = list.len();
        list.extend(
            given
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned),
        );
        if list.len() == before {
            return Err(format!("{flag} needs a URL"));
        }
        Ok(true)
    }

    /// The one deployment the flags name, if any; two kinds at once are a usage error.
    pub(crate) fn target(self) -> Result<Option<Target>, String> {
        let kinds = [
            ("--url", !self.urls.is_empty()),
            ("--cluster", !self.cluster.is_empty()),
            ("--sentinel", !self.sentinels.is_empty()),
        ];
        let given: Vec<&str> = kinds.iter().filter(|k| k.1).map(|k| k.0).collect();
        if given.len() > 1 {
            return Err(format!(
                "{} name different deployments; give one of --url, --cluster, --sentinel",
                given.join(" and ")
            ));
        }
        if self.master.is_some() && self.sentinels.is_empty() {
            return Err("--master goes with --sentinel".to_owned());
        }
        Ok(match given.first() {
            None => None,
            Some(&"--url") => Some(Target::Servers(self.urls)),
            Some(&"--cluster") => Some(Target::Cluster(self.cluster)),
            Some(_) => Some(Target::Sentinel {
                urls: self.sentinels,
                master: self
                    .master
                    .ok_or("--sentinel needs --master NAME, the master the Sentinels watch")?,
            }),
        })
    }
}

/// Where the deployment comes from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Flag(Target),
    Env,
    /// Nothing names a server.
    Local,
}

impl Source {
    /// The flag's deployment, else the environment's (read through `var`), else [`Source::Local`].
    pub(crate) fn pick(flag: Option<Target>, var: impl Fn(&str) -> Option<String>) -> Source {
        match flag {
            Some(target) => Source::Flag(target),
            None if SERVER_VARS.iter().any(|&name| var(name).is_some()) => Source::Env,
            None => Source::Local,
        }
    }

    /// A builder for this deployment.
    pub(crate) fn builder(self) -> Result<LockerBuilder, lock_runtime::LockError> {
        Ok(match self {
            Source::Flag(Target::Servers(urls)) => Locker::builder().urls(urls),
            Source::Flag(Target::Cluster(urls)) => Locker::builder().cluster(urls),
            Source::Flag(Target::Sentinel { urls, master }) => {
                Locker::builder().sentinel(urls, master)
            }
            Source::Env => LockerBuilder::from_env()?,
            Source::Local => Locker::builder().url(LOCAL),
        })
    }
}

/// A variable of the process environment, when it is set to more than blanks (as `from_env`
/// reads them).
pub(crate) fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(flags: &[(&str, &str)]) -> Result<Option<Target>, String> {
        let mut f = Flags::default();
        for (flag, value) in flags {
            assert!(f.take(flag, |_| Ok((*value).to_owned()))?);
        }
        f.target()
    }

    #[test]
    fn flags_name_one_deployment() {
        assert_eq!(target(&[]), Ok(None));
        assert_eq!(
            target(&[
                ("--url", "redis://a:1"),
                ("--url", "redis://b:1,redis://c:1")
            ]),
            Ok(Some(Target::Servers(vec![
                "redis://a:1".into(),
                "redis://b:1".into(),
                "redis://c:1".into()
            ])))
        );
        assert_eq!(
            target(&[("--cluster", "redis://a:1, redis://b:1")]),
            Ok(Some(Target::Cluster(vec![
                "redis://a:1".into(),
                "redis://b:1".into()
            ])))
        );
        assert_eq!(
            target(&[("--master", "m"), ("--sentinel", "redis://s:26379")]),
            Ok(Some(Target::Sentinel {
                urls: vec!["redis://s:26379".into()],
                master: "m".into()
            }))
        );
        for bad in [
            &[("--url", "redis://a:1"), ("--cluster", "redis://b:1")][..],
            &[("--url", "redis://a:1"), ("--sentinel", "redis://s:1")],
            &[("--sentinel", "redis://s:1")],
            &[("--master", "m")],
        ] {
            assert!(target(bad).is_err(), "{bad:?}");
        }
        assert!(
            Flags::default()
                .take("--url", |_| Ok(" , ".into()))
                .is_err()
        );
    }

    #[test]
    fn a_flag_wins_over_the_environment() {
        let env = |name: &str| (name == "LOCK_REDIS_URL").then(|| "redis://env:1".to_owned());
        let flag = Target::Servers(vec!["redis://flag:1".into()]);
        assert_eq!(Source::pick(Some(flag.clone()), env), Source::Flag(flag));
        assert_eq!(Source::pick(None, env), Source::Env);
        let master_only =
            |name: &str| (name == "LOCK_REDIS_SENTINEL_MASTER").then(|| "m".to_owned());
        assert_eq!(Source::pick(None, master_only), Source::Local);
    }
}
