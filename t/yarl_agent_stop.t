#!/usr/bin/perl

# The sync agent's worker stopped (SIGSTOP) mid-round for longer than its lease, then
# continued (SIGCONT): another worker takes the lease, but never writes the zone beside the
# stopped agent, which finishes its round, finds its lease gone and stops. Rounds here last
# the whole sync timeout (one root never answers), so the stop lands mid-round. The zone's
# write section counts what matters: the new agent's waits while the old one was inside,
# and overlaps (two writers at once), which must stay 0.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

# A root that takes connections and never answers: every round waits out the timeout.
my $silent = IO::Socket::INET->new(Listen => 1024, LocalAddr => '127.0.0.1', LocalPort => 0,
	Proto => 'tcp', ReuseAddr => 1) or die "listen: $!\n";
my $silent_port = $silent->sockport;

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<"EOF2", workers => 2);
    yarl_roots %%ROOT_A%% http://127.0.0.1:$silent_port;
    yarl_sync_interval 100ms;
    yarl_sync_timeout 400ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / { yarl_account q; }
        location = /stats { yarl_stats; }
    }
EOF2
$t->run_root('A');
$t->run();
$t->put_quota('q', 0.001, 1e6, 1e6);
my $p = $t->port(8080);
ok($t->wait_quota($p, 'q', 10), 'quota fetched');

my ($per) = $t->sync_threads();
my ($agent) = grep { $per->{$_} } keys %$per;
ok($agent, "the agent runs in worker $agent");
my $s = $t->stats($p);
is($s->{agent}{write_overlaps}, 0, 'no overlapping writers to begin with');

# Stop the agent's worker for 2 s: three times its lease (2 intervals + the timeout).
kill 'STOP', $agent;
my $taken = $t->wait_for(sub {
	my $st = $t->stats($p) or return 0;
	return ($st->{agent}{pid} // 0) != $agent;
}, 5);
ok($taken, 'another worker took the lease');
sleep 1.5;
$s = $t->stats($p);
cmp_ok($s->{agent}{write_waits}, '>', 0,
	"the new agent waited while the stopped one was inside ($s->{agent}{write_waits} rounds)");
kill 'CONT', $agent;

# The old agent ends its round and stops; the new one writes from then on.
ok($t->wait_for(sub {
	my ($per) = $t->sync_threads();
	my $n = 0;
	$n += $_ for values %$per;
	return $n == 1 && !$per->{$agent};
}, 5), 'one sync thread again, in the new agent\'s worker');
my $waits = $t->stats($p)->{agent}{write_waits};
ok($t->wait_for(sub {
	my $st = $t->stats($p) or return 0;
	return $st->{rounds} && $st->{cluster_fresh};
}, 5), 'the new agent syncs');
sleep 1;
$s = $t->stats($p);
is($s->{agent}{write_waits}, $waits, 'and no longer waits');
is($s->{agent}{write_overlaps}, 0, 'never two writers of the zone at once');
is(status_of(http_get($p, '/index.html')), 200, 'requests are served');

$t->finish();
done_testing();
