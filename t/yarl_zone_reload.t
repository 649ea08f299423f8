#!/usr/bin/perl

# nginx -s reload keeps the zone: quotas and counters stay, nothing is fetched again, and
# the root sees the same limiter continue its session (no new session, no first contact),
# while the sync agent moves to a worker of the new configuration.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use POSIX ();
use Time::HiRes qw(time sleep);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_account q;
        }
        location = /stats {
            yarl_stats;
        }
    }
EOF2
$t->run_root('A');
$t->run();
# Drains 0.001/s: the fill is a count of what was admitted.
$t->put_quota('q', 0.001, 1e6, 1e6);
ok($t->wait_quota($t->port(8080), 'q', 5), 'quota fetched');

is(status_of(http_get($t->port(8080), '/index.html')), 200, "request $_") for 1 .. 50;
my $root_fill = sub {
	my (undef, $b) = $t->admin('GET', '/v1/quotas/q');
	return ref $b ? $b->{counter}{fill} : -1;
};
ok($t->wait_for(sub { $root_fill->() >= 49.9 }, 5), 'the root counted the 50');

my $before = $t->stats($t->port(8080));
my $m0 = $t->root_metrics();

# A client keeps sending during the reloads (bounded in time and count).
pipe(my $rd, my $wr) or die "pipe: $!\n";
my $pid = fork() // die "fork: $!\n";
if (!$pid) {
	close $rd;
	my ($n, $ok) = (0, 0);
	my $end = time() + 3;
	while (time() < $end && $n < 5000) {
		$n++;
		$ok++ if status_of(http_get($t->port(8080), '/index.html')) == 200;
		sleep 0.005;
	}
	print $wr "$n $ok\n";
	close $wr;
	POSIX::_exit(0);
}
close $wr;
for my $i (1 .. 3) {
	sleep 0.5;
	ok($t->reload(), "reload $i under traffic");
}
my ($n, $ok) = split ' ', (<$rd> // '0 0');
waitpid($pid, 0);
is($ok, $n, "every request during the reloads passed ($n)");

my $total = 50 + $n;
ok($t->wait_for(sub { abs($root_fill->() - $total) < 0.5 }, 5),
	"the root counted every request exactly once ($total)") or diag('root fill ' . $root_fill->());
my $after = $t->stats($t->port(8080) , "/stats?quota=q");
cmp_ok(abs($after->{quota}{fill} - $total), '<', 0.5, 'the zone kept its counter across reloads');
is($after->{limiter_id}, $before->{limiter_id}, 'the same limiter after the reloads');
cmp_ok($after->{generation}, '>', $before->{generation}, 'the generation moved on');
ok($t->wait_for(sub {
	my $s = $t->stats($t->port(8080));
	my %new = map { $_ => 1 } $t->worker_pids;
	$s && $s->{agent}{pid} && $new{$s->{agent}{pid}};
}, 3), 'a worker of the new configuration runs the sync agent');

my $m1 = $t->root_metrics();
for my $k (qw(yarl_root_sessions_created_total yarl_root_first_contacts_total yarl_root_quotas_sent_total)) {
	ok(defined $m1->{$k}, "$k is exported");
	is($m1->{$k}, $m0->{$k}, "$k unchanged: no new session, no first contact, no refetch ($m0->{$k})");
}
is($m1->{yarl_root_limiters}, 1, 'the root knows one limiter');

# A reload that would change the zone's layout (here its key table, the size unchanged, so
# nginx hands the new configuration the same memory) is refused with an [emerg]: the
# workers of the running configuration go on using that memory, and formatting it again
# under them cleared their counters, in-flight slots and ledger rows.
(my $conf = $t->read_file('nginx.conf')) =~ s/(yarl_roots )/yarl_zone 32m keys=1000;\n    $1/
	or die "no yarl_roots line\n";
$t->write_file('nginx.conf', $conf);
$t->allow_alerts(qr/yarl_zone: zone "yarl" cannot change on reload/);
my @workers = sort $t->worker_pids;
my $filled = $t->stats($t->port(8080), "/stats?quota=q")->{quota}{fill};
kill 'HUP', $t->master_pid;
ok($t->wait_for(sub { $t->read_file('error.log') =~ /yarl_zone: zone "yarl" cannot change on reload: .*key table holds \d+ keys, the configuration asks for \d+.*restart nginx/ }, 5),
	'the reload is refused with an [emerg] naming yarl_zone and what to do');
sleep 0.5;
is(join(',', sort $t->worker_pids), join(',', @workers), 'the running workers go on');
is(status_of(http_get($t->port(8080), '/index.html')), 200, 'and serve');
my $kept = $t->stats($t->port(8080), "/stats?quota=q");
cmp_ok(abs($kept->{quota}{fill} - ($filled + 1)), '<', 0.5, 'on the zone as it was');
is($kept->{limiter_id}, $before->{limiter_id}, 'the same limiter');

$t->finish();
done_testing();
