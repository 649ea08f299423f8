#!/usr/bin/perl

# The per-worker sync thread: exactly one per worker, none in the master; reload starts it
# in the new workers and joins it in the old ones; quit joins it and nginx exits cleanly.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_file_expand('nginx.conf', <<'EOF2');
%%TEST_GLOBALS%%
worker_processes 2;
events { }
http {
    %%TEST_GLOBALS_HTTP%%
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_account "q_$arg_q";
        }
    }
}
EOF2
$t->run();

sub sync_threads {
	my ($pid) = @_;
	return scalar grep { $_ eq 'yarl-sync' } $t->thread_names($pid);
}

my @workers = $t->worker_pids();
is(scalar @workers, 2, 'two workers');
is(sync_threads($_), 1, "worker $_ runs one sync thread") for @workers;
is(sync_threads($t->master_pid), 0, 'no thread in the master');

is(status_of(http_get($t->port(8080), "/index.html?q=$_")), 200, "request $_") for 1 .. 3;

for my $round (1 .. 3) {
	my @old = $t->worker_pids();
	ok($t->reload(), "reload $round: new workers");
	my %old = map { $_ => 1 } @old;
	my @new = grep { !$old{$_} } $t->worker_pids();
	is(scalar @new, 2, "reload $round: two new workers");
	ok($t->wait_for(sub { !grep { kill 0, $_ } @old }, 10), "reload $round: old workers exited");
	is(sync_threads($_), 1, "reload $round: worker $_ runs one sync thread") for @new;
	is(status_of(http_get($t->port(8080), '/index.html?q=a')), 200, "reload $round: serves");
}

$t->finish();

my $log = $t->read_file('error.log');
my $started = () = $log =~ /yarl: sync thread started/g;
my $joined = () = $log =~ /yarl: sync thread joined/g;
is($started, 8, 'threads started: 2 workers x 4 generations');
is($joined, $started, 'every thread joined');
unlike($log, qr/exited on signal/, 'no worker crashed');

done_testing();
