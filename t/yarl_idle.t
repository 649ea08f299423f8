#!/usr/bin/perl

# A quiet quota banks nothing: after a pause, a burst gets what an empty leaky bucket admits
# (low_burst, plus what drains during the burst), never the drain of the whole pause.
# A 5/s quota with a hard cutoff at 5, bursts of 100 back-to-back requests on one keep-alive
# connection after pauses of 10, 0, 3 and 10 s; each burst is compared with an exact leaky
# bucket fed the same requests at the times they were sent.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use HTTP::Tiny;
use Test::More;
use Test::Yarl;
use Time::HiRes qw(sleep time);

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('q', 5, 5, 5);
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 1);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 1s;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / { yarl_account q; }
        location = /stats { yarl_stats; }
    }
EOF2
$t->run();
my $p = $t->port(8080);
ok($t->wait_quota($p, 'q', 5), 'quota arrived');

my $http = HTTP::Tiny->new(keep_alive => 1, timeout => 5);
my ($limit, $low) = (5, 5);
my ($fill, $at) = (0, time());

# One burst: the statuses nginx answered and what the exact bucket admits of the same
# requests, sent at the same times.
sub burst {
	my ($ok, $ideal, $other) = (0, 0, 0);
	for (1 .. 100) {
		my $now = time();
		$fill = $fill - $limit * ($now - $at);
		$fill = 0 if $fill < 0;
		$at = $now;
		if ($fill <= $low) {
			$fill += 1;
			$ideal++;
		}
		my $status = $http->get("http://127.0.0.1:$p/index.html")->{status};
		if ($status == 200) { $ok++ } elsif ($status != 429) { $other++ }
	}
	return ($ok, $ideal, $other);
}

my @rows;
for my $pause (undef, 10, 0, 3, 10) {
	sleep($pause) if $pause;
	my ($ok, $ideal, $other) = burst();
	push @rows, [$pause // '(first)', $ok, $ideal];
	is($other, 0, 'only 200 and 429 after a pause of ' . ($pause // 'none'));
	# Fewer than the exact bucket only by what the root's view adds (counts reach it up
	# to an interval after they were made): one interval of the limit.
	ok($ok <= $ideal + 1 && $ok >= $ideal - $limit,
		"pause " . ($pause // '(first)') . ": $ok of 100 passed, the exact bucket $ideal");
}
diag(sprintf "pause %-7s passed %3d of 100, exact leaky bucket %d", @$_) for @rows;

$t->finish();
done_testing();
