#!/usr/bin/perl

# yarl_prometheus: a real Prometheus (Debian's `prometheus`) scrapes a root's /metrics and
# nginx's yarl_metrics while traffic runs, with the shipped alert rules loaded
# (packaging/prometheus/yarl-alerts.yml, with every `for:` cut to 0s so that an alert fires
# as soon as its condition holds). Checked through Prometheus's HTTP API:
# - `promtool check metrics` accepts both pages;
# - every series either side exports is stored, with sane values, and is named in
#   docs/operations.md; every metric the docs name is exported;
# - every rule evaluates without error, and every metric and label its expression names
#   exists (no typo survives);
# - every query of the Grafana dashboard (packaging/grafana/yarl-dashboard.json) returns data;
# - alerts fire when their condition is induced: a quota rejecting most requests, a token
#   refused, the key table full, the zone full, then the root stopped.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of body_of);
use HTTP::Tiny;
use JSON::PP;
use POSIX ();

my $prometheus = $ENV{TEST_YARL_PROMETHEUS} // '/usr/bin/prometheus';
my $promtool = $ENV{TEST_YARL_PROMTOOL} // '/usr/bin/promtool';
plan(skip_all => "no $prometheus (Debian package prometheus; make deps installs it)")
	unless -x $prometheus && -x $promtool;

my $repo = "$FindBin::Bin/..";
my $json = JSON::PP->new->canonical;
my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_file('admin.token', "prometheus-test-admin-token\n");
$t->write_file('sync.token', "prometheus-test-sync-token\n");
$t->write_http_conf(<<'EOF');
    yarl_zone 256k keys=64;
    yarl_roots http://127.0.0.1:%%PORT_ROOT_A%%;
    yarl_sync_token prometheus-test-sync-token;
    yarl_sync_interval 100ms;
    yarl_sync_timeout 200ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location /busy { alias %%TESTDIR%%/index.html; yarl_account busy; }
        location /ok { alias %%TESTDIR%%/index.html; yarl_account ok; }
        location /k { alias %%TESTDIR%%/index.html; yarl_account k_$arg_k; }
        location = /metrics { yarl_metrics; }
        location = /stats { yarl_stats; }
    }
EOF
$t->allow_alerts(qr/yarl: zone "yarl" is full/);
my $dir = $t->testdir;
$t->run_root('A', '--admin-token-file', "$dir/admin.token", '--sync-token-file', "$dir/sync.token");

my $http = HTTP::Tiny->new(timeout => 10);
sub slurp {
	my ($path) = @_;
	open(my $fh, '<', $path) or die "$path: $!\n";
	local $/;
	return scalar <$fh>;
}
sub admin {
	my ($method, $path, $body, $token) = @_;
	my $res = $http->request($method, $t->root_url('A') . $path, {
		headers => {
			'Content-Type' => 'application/json',
			Authorization => 'Bearer ' . ($token // 'prometheus-test-admin-token'),
		},
		defined $body ? (content => $json->encode($body)) : (),
	});
	return $res->{status};
}

is(admin('POST', '/v1/quotas:batch', [
	{ name => 'busy', limit => 2, low_burst => 2, high_burst => 2 },
	{ name => 'ok', limit => 10000, low_burst => 10000, high_burst => 10000 },
	# Keys that never drain in the test: the key table fills and stays full.
	{ name => 'k_*', limit => 0.001, low_burst => 1, high_burst => 1 },
	# A cap on requests in flight: nginx's agent reports on it every round, so the root
	# exports its escrow (yarl_root_in_flight_*).
	{ name => 'uploads', max_in_flight => 5 },
]), 200, 'quotas created');
# One refused token before the first scrape, so that the root's refusal counter has a series.
is(admin('GET', '/v1/quotas', undef, 'a-wrong-token'), 401, 'a wrong admin token is refused');
$t->run();
ok($t->wait_quota($t->port(8080), 'busy', 10), 'nginx holds the quotas');

# Prometheus: 1 s scrapes and evaluations; the shipped rules with `for:` at 0s.
my $prom_port = $t->port('PROM');
my $rules = slurp("$repo/packaging/prometheus/yarl-alerts.yml");
my $n_for = ($rules =~ s/^(\s+)for: \S+$/${1}for: 0s/mg);
ok($n_for >= 15, "the rules' for: cut to 0s ($n_for)");
$t->write_file('rules.yml', $rules);
my ($root_port, $nginx_port) = ($t->port('ROOT_A'), $t->port(8080));
$t->write_file('prometheus.yml', <<"EOF");
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [$dir/rules.yml]
scrape_configs:
- job_name: yarl-root
  static_configs: [{targets: ['127.0.0.1:$root_port']}]
- job_name: yarl-nginx
  static_configs: [{targets: ['127.0.0.1:$nginx_port']}]
EOF
my $prom_pid = fork() // die "fork: $!\n";
if (!$prom_pid) {
	open STDOUT, '>>', "$dir/prometheus.log";
	open STDERR, '>>', "$dir/prometheus.log";
	exec($prometheus, "--config.file=$dir/prometheus.yml", "--storage.tsdb.path=$dir/tsdb",
		"--web.listen-address=127.0.0.1:$prom_port", '--log.level=warn')
		or POSIX::_exit(127);
}

# Traffic for at most 150 s: 4 of every 6 requests to `busy` (2/s, so nearly all of them
# rejected), one to `ok`, one to a new key.
my $traffic = fork() // die "fork: $!\n";
if (!$traffic) {
	my $end = time() + 150;
	my $k = 0;
	while (time() < $end) {
		http_get($nginx_port, '/busy') for 1 .. 4;
		http_get($nginx_port, '/ok');
		http_get($nginx_port, '/k?k=' . $k++);
		select(undef, undef, undef, 0.05);
	}
	POSIX::_exit(0);
}

END {
	for my $pid (grep { defined && $_ > 0 } $traffic, $prom_pid) {
		kill 'TERM', $pid;
		waitpid($pid, 0);
	}
}

sub query {
	my ($q) = @_;
	my $url = "http://127.0.0.1:$prom_port/api/v1/query?query=" . uri_escape($q);
	my $res = $http->get($url);
	my $body = eval { $json->decode($res->{content}) };
	return undef unless $body && $body->{status} && $body->{status} eq 'success';
	return $body->{data}{result};
}

sub uri_escape {
	my ($s) = @_;
	$s =~ s/([^A-Za-z0-9\-_.~])/sprintf('%%%02X', ord($1))/ge;
	return $s;
}

sub api {
	my ($path) = @_;
	my $res = $http->get("http://127.0.0.1:$prom_port$path");
	return eval { $json->decode($res->{content}) };
}

ok($t->wait_for(sub {
	my $r = query('up == 1') or return 0;
	return @$r == 2;
}, 30), 'Prometheus scrapes the root and nginx') or diag($t->read_file('prometheus.log'));
# Two scrapes at least under rate(): a few seconds of traffic.
ok($t->wait_for(sub {
	my $r = query('sum(rate(yarl_requests_total{status="rejected"}[1m])) > 0');
	return $r && @$r;
}, 20), 'rejections are counted');

# promtool's own parser and linter on both pages.
my %pages = (
	root => $http->get($t->root_url('A') . '/metrics')->{content},
	nginx => body_of(http_get($nginx_port, '/metrics')),
);
for my $side (sort keys %pages) {
	open(my $pipe, '|-', "$promtool check metrics > $dir/promtool_$side.txt 2>&1")
		or die "promtool: $!\n";
	print $pipe $pages{$side};
	close $pipe;
	is($? >> 8, 0, "promtool check metrics accepts the $side page")
		or diag($t->read_file("promtool_$side.txt"));
}

# Every exported metric is stored, with sane values, and documented.
my $docs = slurp("$repo/docs/operations.md");
my %exported;
for my $side (sort keys %pages) {
	$exported{$1} = $2 while $pages{$side} =~ /^# TYPE (\S+) (\S+)$/mg;
}
cmp_ok(scalar(keys %exported), '>=', 70, scalar(keys %exported) . ' metrics exported');
my @missing_docs = grep { $docs !~ /\b\Q$_\E\b/ } sort keys %exported;
is("@missing_docs", '', 'docs/operations.md names every exported metric');
my @unstored;
my @insane;
for my $name (sort keys %exported) {
	my $sel = $exported{$name} eq 'histogram' ? "${name}_bucket" : $name;
	my $r = query($sel);
	if (!$r || !@$r) {
		push @unstored, $name;
		next;
	}
	for my $s (@$r) {
		my $v = $s->{value}[1];
		push @insane, "$name=$v" unless $v =~ /^\d+(\.\d+)?(e[+-]?\d+)?$/ || $v eq '+Inf';
	}
}
is("@unstored", '', 'Prometheus stores every exported metric');
is("@insane", '', 'no metric is negative or NaN');

# Metric names the docs use (tables of what to watch and the reference) are exported.
my %directive = map { $_ => 1 } (slurp("$repo/README.md") =~ /^\| `(yarl_[a-z_]+)/mg);
my %named = map { $_ => 1 } grep { !$directive{$_} } ($docs =~ m{(?<![\$\w/])(yarl_[a-z_]+)}g);
my @unknown = grep {
	my $n = $_;
	!$exported{$n} && !($n =~ /^(.*)_(bucket|sum|count)$/ && $exported{$1}) && $n !~ /^yarl_(sync|root)?_?$/
} sort keys %named;
is("@unknown", '', 'every metric docs/operations.md names is exported');

# Values that must hold in a healthy cluster under this traffic.
my %expect = (
	'yarl_sync_agent_up' => '== 1',
	'yarl_cluster_fresh' => '== 1',
	'yarl_sync_root_up' => '== 1',
	'yarl_root_db_up' => '== 1',
	'yarl_root_limiters' => '== 1',
	'yarl_quotas' => '== 4',
	'yarl_root_quotas' => '== 4',
	'yarl_root_in_flight_part{quota="uploads"}' => '== 5',
	'yarl_root_in_flight_holders{quota="uploads"}' => '== 1',
	'yarl_templates' => '== 1',
	'yarl_epoch - on() yarl_root_epoch' => '== 0',
	'yarl_zone_used_bytes - yarl_zone_size_bytes' => '<= 0',
	'yarl_quota_rejections_total{quota="busy"}' => '> 0',
	'rate(yarl_requests_total{status="passed"}[1m])' => '> 0',
	'rate(yarl_root_syncs_applied_total[1m])' => '> 0',
	'rate(yarl_sync_rounds_total[1m])' => '> 1',
	'yarl_keys' => '> 0',
);
for my $e (sort keys %expect) {
	ok($t->wait_for(sub { my $r = query("$e $expect{$e}"); $r && @$r }, 10), "$e $expect{$e}");
}

# Rules: all loaded, all evaluating without error.
my $rules_api;
ok($t->wait_for(sub {
	$rules_api = api('/api/v1/rules') or return 0;
	my @r = map { @{$_->{rules}} } @{$rules_api->{data}{groups}};
	return @r && !grep { !defined $_->{lastEvaluation} || $_->{lastEvaluation} =~ /^0001/ } @r;
}, 10), 'every rule was evaluated');
my @rules = map { @{$_->{rules}} } @{$rules_api->{data}{groups}};
my $n_rules = () = $rules =~ /^\s+- alert: /mg;
is(scalar(@rules), $n_rules, "Prometheus loaded the $n_rules rules");
my @unhealthy = map { "$_->{name}: $_->{lastError}" } grep { $_->{health} ne 'ok' } @rules;
is("@unhealthy", '', 'every rule evaluates without error');

# Each selector of each rule names a stored metric, and each label it matches on exists on
# that metric. Label values seen only during incidents (a refusal's reason, a failed sync)
# are checked by the induced alerts below and by promtool test rules.
for my $rule (@rules) {
	for my $sel ($rule->{query} =~ /\b((?:yarl_[a-z_]+|up)(?:\{[^}]*\})?)(?!\s*\()/g) {
		my ($name, $matchers) = $sel =~ /^([a-z_]+)(?:\{(.*)\})?$/;
		next if $name =~ /^(by|on|sum|max|min|rate|or|and)$/;
		my @labels = ($matchers // '') =~ /(\w+)\s*(?:=~|!=|!~|=)/g;
		my $by = @labels ? 'count by (' . join(',', @labels) . ") ($name)" : "count($name)";
		my $r = query($by);
		ok($r && @$r, "$rule->{name}: $name" . (@labels ? " with labels @labels" : '') . ' is stored');
		for my $l (@labels) {
			ok(!grep({ !exists $_->{metric}{$l} } @{$r // []}), "$rule->{name}: $name has label $l")
				if $r && @$r;
		}
	}
}

# The dashboard: every panel's query returns data.
my $dash = $json->decode(slurp("$repo/packaging/grafana/yarl-dashboard.json"));
my @targets = map { @{$_->{targets} // []} } @{$dash->{panels}};
cmp_ok(scalar(@targets), '>=', 15, scalar(@targets) . ' dashboard queries');
for my $p (@{$dash->{panels}}) {
	for my $tg (@{$p->{targets}}) {
		(my $q = $tg->{expr}) =~ s/\$__rate_interval/1m/g;
		ok($t->wait_for(sub { my $r = query($q); $r && @$r }, 10),
			"dashboard \"$p->{title}\" $tg->{refId} returns data") or diag($q);
	}
}

sub firing {
	my ($alert, %labels) = @_;
	my $a = api('/api/v1/alerts') or return 0;
	return scalar grep {
		my $al = $_;
		$al->{labels}{alertname} eq $alert && $al->{state} eq 'firing'
			&& !grep { ($al->{labels}{$_} // '') ne $labels{$_} } keys %labels
	} @{$a->{data}{alerts}};
}

sub none_firing {
	my $a = api('/api/v1/alerts') or return 'no answer';
	return join(' ', map { $_->{labels}{alertname} } grep { $_->{state} eq 'firing' } @{$a->{data}{alerts}});
}

# Induced conditions, one at a time.
ok($t->wait_for(sub { firing('YarlQuotaRejectingMost', quota => 'busy') }, 20),
	'YarlQuotaRejectingMost fires for the quota rejecting most requests');
# New keys faster than a sync round lets the table's keys go (a key's count must reach the
# roots before its slot may be reused): bursts of 400 new keys, at most 5.
my $burst = 0;
ok($t->wait_for(sub {
	return 1 if firing('YarlKeyTableFull');
	if ($burst < 5) {
		$burst++;
		http_get($nginx_port, "/k?k=burst${burst}_$_") for 1 .. 400;
	}
	return 0;
}, 30), "YarlKeyTableFull fires once new keys find the key table full ($burst bursts)");
is(admin('GET', '/v1/quotas', undef, 'a-wrong-token'), 401, 'a wrong admin token is refused again');
ok($t->wait_for(sub { firing('YarlRootTokensRefused', route => 'list') }, 15),
	'YarlRootTokensRefused fires');
for my $a (qw(YarlZoneFull YarlNoRootAnswering YarlRootDown YarlSyncsFailing)) {
	ok(!firing($a), "$a does not fire while its condition does not hold");
}

# Fill the zone: more quotas than it holds.
my $cap = query('yarl_zone_capacity_quotas')->[0]{value}[1];
is(admin('POST', '/v1/quotas:batch',
	[map { { name => "fill$_", limit => 1000, low_burst => 1000, high_burst => 1000 } } 1 .. $cap + 10]),
	200, "$cap + 10 quotas created");
ok($t->wait_for(sub { firing('YarlZoneFull') }, 20), 'YarlZoneFull fires when quotas do not fit');
ok($t->wait_for(sub { firing('YarlZoneNearlyFull') }, 10), 'YarlZoneNearlyFull fires');

# Stop the root: the nginx side and the scrape notice.
$t->stop_root('A');
ok($t->wait_for(sub { firing('YarlRootDown') }, 20), 'YarlRootDown fires when the root stops');
ok($t->wait_for(sub { firing('YarlNoRootAnswering') }, 20), 'YarlNoRootAnswering fires');
ok($t->wait_for(sub { firing('YarlRootUnreachable') }, 20), 'YarlRootUnreachable fires');
ok($t->wait_for(sub { firing('YarlSyncsFailing') }, 60), 'YarlSyncsFailing fires')
	or diag(explain(query('sum by (result) (increase(yarl_sync_requests_total[5m]))')));
diag('firing at the end: ' . none_firing());

kill 'TERM', $traffic;
waitpid($traffic, 0);
$traffic = undef;
kill 'TERM', $prom_pid;
ok($t->wait_for(sub { waitpid($prom_pid, POSIX::WNOHANG()) == $prom_pid }, 15), 'Prometheus stopped');
$prom_pid = undef;
$t->finish();
done_testing();
