#!/usr/bin/perl

# Binary upgrade (USR2 to the master, then QUIT to the old one): the new master makes a new
# zone, fetches the quotas and syncs as a new limiter while the old one finishes; nothing
# crashes and both stop cleanly.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);

my $t = Test::Yarl->new();
# A daemon is not our child: stop whatever master the pid files name, whatever happens.
END {
	return unless $t;
	for my $f ('nginx.pid', 'nginx.pid.oldbin') {
		chomp(my $p = $t->read_file($f) // '');
		kill 'TERM', $p if $p =~ /^\d+$/;
	}
}
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
# nginx only changes its binary when its parent is gone (a daemon): ngx_signal_handler ignores
# USR2 while the process that started it lives. So this test runs nginx as a daemon.
system($t->nginx_cmd()) == 0 or die "nginx did not start\n";
ok($t->wait_port($t->port(8080)), 'nginx listens');
# The daemon writes its pid file after it forked away from us: wait for it.
$t->wait_for(sub { $t->read_file('nginx.pid') =~ /^\d+$/m }, 10) or die "no pid file\n";
chomp(my $old = $t->read_file('nginx.pid'));
$t->put_quota('q', 1, 100, 100);
ok($t->wait_quota($t->port(8080), 'q', 5), 'quota fetched');
is(status_of(http_get($t->port(8080), '/index.html')), 200, 'served before the upgrade');
my $old_id = $t->stats($t->port(8080))->{limiter_id};

kill 'USR2', $old;
# The new master writes nginx.pid after renaming the old one: an empty read is not a new pid.
ok($t->wait_for(sub {
	-e $t->testdir . '/nginx.pid.oldbin' && ($t->read_file('nginx.pid') =~ /^(\d+)/ && $1 != $old)
}, 10),
	'a new master started');
chomp(my $new = $t->read_file('nginx.pid'));
ok($t->wait_for(sub { $t->root_metrics()->{yarl_root_limiters} == 2 }, 5),
	'the root sees the new master as a second limiter');

kill 'QUIT', $old;
ok($t->wait_for(sub { !kill(0, $old) }, 15), 'the old master exited');
my $s;
ok($t->wait_for(sub {
	$s = $t->stats($t->port(8080), '/stats?quota=q');
	$s && $s->{limiter_id} ne $old_id && $s->{quota};
}, 5), 'the new master answers with a new zone that fetched the quota');
is(status_of(http_get($t->port(8080), '/index.html')), 200, 'served after the upgrade');

kill 'QUIT', $new;
ok($t->wait_for(sub { !kill(0, $new) }, 15), 'the new master exited');
my @bad = grep { /\[(alert|crit|emerg)\]/ } split /\n/, $t->read_file('error.log');
is(join("\n", @bad), '', 'no alerts in error.log');
unlike($t->read_file('error.log'), qr/exited on signal/, 'no worker crashed');
$t->stop_root('A');
done_testing();
