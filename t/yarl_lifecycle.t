#!/usr/bin/perl

# The sync thread: exactly one in one worker, none in the master; after a reload the old
# configuration's worker stops it and a new worker starts one; quit joins it and nginx
# exits cleanly.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 2);
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_account "q_$arg_q";
        }
    }
EOF2
$t->run();

sub threads {
	my ($per, $master) = $t->sync_threads();
	my $n = 0;
	$n += $_ for values %$per;
	return ($n, $master, grep { $per->{$_} } keys %$per);
}

my @workers = $t->worker_pids();
is(scalar @workers, 2, 'two workers');
# A worker takes the agent role at a tick after start, and a thread takes its name once it
# runs: wait for the first, then there must be exactly one.
my ($n, $master, $agent);
$t->wait_for(sub { ($n, $master, $agent) = threads(); $n >= 1 }, 5);
is($n, 1, 'one sync thread among the workers');
is($master, 0, 'no thread in the master');

is(status_of(http_get($t->port(8080), "/index.html?q=$_")), 200, "request $_") for 1 .. 3;

for my $round (1 .. 3) {
	my @old = $t->worker_pids();
	ok($t->reload(), "reload $round: new workers");
	my %old = map { $_ => 1 } @old;
	my @new = grep { !$old{$_} } $t->worker_pids();
	is(scalar @new, 2, "reload $round: two new workers");
	ok($t->wait_for(sub { !grep { kill 0, $_ } @old }, 10), "reload $round: old workers exited");
	my %new = map { $_ => 1 } @new;
	ok($t->wait_for(sub { my ($n, undef, $a) = threads(); $n == 1 && $a && $new{$a} }, 3),
		"reload $round: one sync thread, in a new worker");
	is(status_of(http_get($t->port(8080), '/index.html?q=a')), 200, "reload $round: serves");
}

$t->finish();

my $log = $t->read_file('error.log');
my $started = () = $log =~ /yarl: sync agent started in this worker/g;
my $ended = () = $log =~ /yarl: (sync agent stopped in this worker|sync thread joined)/g;
is($started, 4, 'one agent started per configuration generation');
is($ended, $started, 'every agent thread stopped and joined');
unlike($log, qr/exited on signal/, 'no worker crashed');

done_testing();
